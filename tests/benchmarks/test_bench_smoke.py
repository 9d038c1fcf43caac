"""The benchmark harness runs end to end on a tiny model and writes every field it reports."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCH_DIR = ROOT / "benchmarks"
TINY = [
    *("--shape", "tiny", "--threads", "1", "--warmup", "1", "--steps", "1", "--repeats", "1"),
    *("--batch-tokens", "40", "--sentences", "2", "--infer-batch", "2", "--new-tokens", "3"),
    *("--decode-repeats", "1", "--decode-rounds", "1", "--beam", "2", "--inline"),
    *("--quiet-wait", "0", "--retries", "0", "--load-interval", "0.01", "--probe-size", "128"),
]
MODULES = ("bench", "peers", "phases", "qkv_side", "report", "workload")


def with_threads(n: int) -> list[str]:
    return [str(n) if TINY[i - 1] == "--threads" else x for i, x in enumerate(TINY)]


def run(bench: Any, tmp_path: Path, *options: str, base: list[str] = TINY) -> tuple[dict, str]:
    out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
    bench.main([*base, *options, "--json", str(out_json), "--md", str(out_md)])
    return json.loads(out_json.read_text()), out_md.read_text()


def test_every_system_reports_every_field_like_for_like(bench: Any, tmp_path: Path) -> None:
    from peers import PEERS, available, trainable
    from workload import SHAPES, make_train_batches, padding

    results, markdown = run(bench, tmp_path, "--peers", ",".join(PEERS), "--no-pair")
    installed = [p for p in PEERS if available(p)]
    assert results["skipped_peers"] == [p for p in PEERS if p not in installed]
    assert list(results["systems"]) == ["qkv", *installed]
    assert results["decode_only"] == [p for p in installed if not trainable(p)]
    peak = results["peak"]
    measured = [*peak["gflops"].values(), *peak["onednn_gflops"].values()]
    assert peak["peak_gflops"] == max(measured) and peak["torch_mm_peak_gflops"] > 0

    qkv = results["systems"]["qkv"]
    assert qkv["train"]["params"]["non_embedding"] > 0
    for batches in ("identical", "bucketed"):
        figures = qkv["train"][batches]
        assert figures["tgt_tokens_per_s"] > 0 and figures["tgt_tokens"] > 0
        assert figures["loss_finite"]
    assert qkv["train"]["qkv_package"] == str((ROOT / "src" / "qkv").resolve())
    assert qkv["decode"]["greedy"]["sentences_per_s"] > 0 and qkv["decode"]["sentences"] == 2
    assert qkv["decode"]["beam"]["sentences_per_s"] > 0 and qkv["decode"]["beam"]["k"] == 2
    # one thread: no split; qkv's own batching beside one batch at a time
    assert list(qkv["decode"]["greedy"]["ways"]) == ["one", "shipped"]
    assert qkv["decode"]["greedy"]["headline"] == "one"

    # identical batches everywhere, and the padded share of them as counted here
    arrays = make_train_batches(2, 40, 1235, SHAPES["tiny"])[1:]
    expected = padding(arrays)
    digests = set()
    for name in results["systems"]:
        train, decode = results["systems"][name]["train"], results["systems"][name]["decode"]
        assert "error" not in decode and decode["allocator_tuned"], name
        assert decode["greedy"]["sentences_per_s"] > 0, name
        if name in results["decode_only"]:
            assert train == {}, name  # no training phase
            continue
        assert "error" not in train, name
        assert train["allocator_tuned"] and decode["allocator_tuned"], name
        assert train["optimizer"].endswith("fused"), (name, train["optimizer"])
        assert {k: train["batches"][k] for k in expected} == expected, name
        digests.add(train["batches"]["digest"])
    assert len(digests) == 1
    assert 0 < expected["src_pad_share"] < 1 and 0 < expected["tgt_pad_share"] < 1
    assert f"source {100 * expected['src_pad_share']:.1f} %" in markdown
    assert f"target {100 * expected['tgt_pad_share']:.1f} %" in markdown
    assert "Every system trained on these very batches" in markdown
    assert "## Like for like" in markdown and "## As shipped" in markdown
    assert "| qkv |" in markdown and "**qkv / best peer**" in markdown


def test_greedy_headline_gives_every_system_the_same_split(bench: Any, tmp_path: Path) -> None:
    results, markdown = run(
        bench, tmp_path, "--peers", "torch_nn", "--sentences", "6", base=with_threads(2)
    )
    qkv, peer = (results["systems"][n]["decode"] for n in ("qkv", "torch_nn"))
    assert list(qkv["greedy"]["ways"]) == ["split", "one", "shipped"]
    assert list(peer["greedy"]["ways"]) == ["split", "one"]  # a peer has no batching of its own
    for decode in (qkv, peer):
        greedy = decode["greedy"]
        assert greedy["headline"] == "split"
        assert greedy["sentences_per_s"] == greedy["ways"]["split"]["sentences_per_s"]
        assert greedy["ways"]["split"]["workers"] == 2
        assert greedy["ways"]["split"]["threads_each"] == 1
        assert greedy["ways"]["one"]["workers"] == 1
        assert greedy["ways"]["one"]["threads_each"] == 2
    assert list(qkv["beam"]["ways"]) == ["one", "shipped"] and qkv["beam"]["headline"] == "one"
    assert "greedy sent/s, 2 batches at once" in markdown
    assert "every system decodes 2 batches at once" in markdown

    # interleaved in one process: the same two ways for both
    parts = {p["pair_part"]: p for p in results["pairs"]}
    assert parts["train"]["train"]["ratio"] > 0
    rows = parts["decode"]["decode"]["greedy"]
    assert [(r["system"], r["workers"], r["threads_each"]) for r in rows] == [
        ("qkv", 2, 1),
        ("qkv", 1, 2),
        ("torch_nn", 2, 1),
        ("torch_nn", 1, 2),
    ]
    assert "beam" not in parts["decode"]["decode"]  # torch_nn has no beam search
    assert "| greedy sent/s, 2 at once (2 × 1 threads) | torch_nn |" in markdown


def copy_tree(destination: Path) -> Path:
    """A second qkv source tree: this one's package and qkv side."""
    shutil.copytree(ROOT / "src" / "qkv", destination / "src" / "qkv")
    (destination / "benchmarks").mkdir()
    shutil.copy(BENCH_DIR / "qkv_side.py", destination / "benchmarks" / "qkv_side.py")
    return destination


def test_a_baseline_tree_is_one_more_system_with_new_over_old_ratios(
    bench: Any, tmp_path: Path
) -> None:
    tree = copy_tree(tmp_path / "old")
    options = ["--peers", "torch_nn", "--no-pair", "--baseline", str(tree)]
    results, markdown = run(bench, tmp_path, *options, "--baseline-label", "old")
    assert list(results["systems"]) == ["qkv", "qkv@old", "torch_nn"]
    assert results["baselines"] == ["qkv@old"]
    assert results["trees"]["qkv@old"]["path"] == str(tree.resolve())
    old = results["systems"]["qkv@old"]
    for phase in ("train", "decode"):
        # its own processes, with its own package
        assert old[phase]["qkv_package"] == str((tree / "src" / "qkv").resolve()), phase
        assert old[phase]["allocator_tuned"]
    assert old["train"]["identical"]["tgt_tokens_per_s"] > 0
    assert old["train"]["bucketed"]["tgt_tokens_per_s"] > 0
    assert old["decode"]["greedy"]["sentences_per_s"] > 0 and old["decode"]["beam"]["k"] == 2
    assert (
        old["train"]["batches"]["digest"] == results["systems"]["qkv"]["train"]["batches"]["digest"]
    )
    new_old = [line for line in markdown.splitlines() if "**qkv / qkv@old** (new / old)" in line]
    assert len(new_old) == 2  # the like-for-like table and the as-shipped one
    assert all("×" in line for line in new_old)
    assert f"package {(tree / 'src' / 'qkv').resolve()} (no git commit)" in markdown


def test_a_baseline_without_a_qkv_side_is_refused(bench: Any, tmp_path: Path) -> None:
    (tmp_path / "src" / "qkv").mkdir(parents=True)
    with pytest.raises(SystemExit):
        bench.parse(["--baseline", str(tmp_path)])
    with pytest.raises(SystemExit):
        bench.parse(["--baseline-label", "old"])


def test_a_qkv_side_refuses_another_trees_package(bench: Any, tmp_path: Path) -> None:
    from phases import load_qkv_side

    tree = copy_tree(tmp_path / "other")
    with pytest.raises(RuntimeError, match="imports qkv from"):
        load_qkv_side(str(tree))


def test_map_split_runs_the_jobs_in_order_on_a_share_of_the_threads(bench: Any) -> None:
    from phases import map_split

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = list(map_split(lambda i: (i, torch.get_num_threads()), 5, 2))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    # four in two worker threads of one torch thread, the fifth here on both
    assert seen == [(0, 1), (1, 1), (2, 1), (3, 1), (4, 2)]


def test_padding_and_digest_count_the_batches(bench: Any) -> None:
    import numpy as np
    from workload import PAD, SHAPES, digest, make_train_batches, padding

    batch = {
        "src": np.array([[5, 6, 2], [7, 2, PAD]]),
        "tgt_in": np.array([[1, 5, PAD, PAD], [1, 6, 7, 8]]),
        "labels": np.array([[5, 2, PAD, PAD], [6, 7, 8, 2]]),
    }
    counts = padding([batch])
    assert counts["src_tokens"] == 5 and counts["src_padded_tokens"] == 6
    assert counts["tgt_tokens"] == 6 and counts["tgt_padded_tokens"] == 8
    assert counts["src_pad_share"] == pytest.approx(1 / 6)
    assert counts["tgt_pad_share"] == pytest.approx(2 / 8)
    shape = SHAPES["tiny"]
    first, again = (digest(make_train_batches(3, 50, 7, shape)) for _ in range(2))
    assert first == again != digest(make_train_batches(3, 50, 8, shape))


def test_peers_run_at_their_best_settings(bench: Any) -> None:
    """Attention dropout 0.0 (qkv's), and Adam with fused=True, for every installed peer that
    trains."""
    from peers import PEERS, available, build_peer, trainable
    from torch import nn
    from workload import SHAPES

    for name in (p for p in PEERS if available(p) and trainable(p)):
        peer = build_peer(name, SHAPES["tiny"])
        assert peer.optimizer(1e-3).param_groups[0]["fused"], name
        if name == "hf_marian":
            assert peer.model.config.attention_dropout == 0.0
        elif name == "torch_nn":
            attention = [m for m in peer.model.modules() if isinstance(m, nn.MultiheadAttention)]
            assert attention and all(m.dropout == 0.0 for m in attention)
        else:
            from x_transformers.attend import Attend

            attends = [m for m in peer.model.modules() if isinstance(m, Attend)]
            assert attends and all(m.dropout == 0.0 for m in attends), name
            assert all(m.flash == (name == "xtransformers_flash") for m in attends), name


def test_bf16_trains_under_autocast_and_decodes_bf16_weights(bench: Any, tmp_path: Path) -> None:
    """The bf16 path, on the CPU: every system trains under autocast and decodes with its
    weights in bf16, except x-transformers (float32 activations of its own: autocast)."""
    from peers import available

    peers = [p for p in ("torch_nn", "xtransformers") if available(p)]
    options = ["--dtype", "bf16", "--peers", ",".join(peers), "--no-pair", "--beam", "0"]
    results, markdown = run(bench, tmp_path, *options)
    assert results["peak"]["dtype"] == "torch.bfloat16" and results["peak"]["peak_gflops"] > 0
    for name, system in results["systems"].items():
        assert system["train"]["identical"]["loss_finite"], name
        assert system["decode"]["greedy"]["sentences_per_s"] > 0, name
        weights = "torch.float32" if name == "xtransformers" else "torch.bfloat16"
        assert system["decode"]["weights"] == weights, name
    assert "Device cpu, bf16 (training under torch.autocast, decoding with" in markdown


def test_no_decode_measures_training_only(bench: Any, tmp_path: Path) -> None:
    results, markdown = run(bench, tmp_path, "--peers", "torch_nn", "--no-decode")
    for name, system in results["systems"].items():
        assert system["train"]["identical"]["tgt_tokens_per_s"] > 0, name
        assert system["decode"] == {}, name
    assert [p["pair_part"] for p in results["pairs"]] == ["train"]
    assert "| qkv |" in markdown
    # the interleaved MFU, with the pair phase's probes beside those of qkv's training phase
    mfu_line = next(line for line in markdown.splitlines() if "qkv MFU, interleaved" in line)
    assert "probes" in mfu_line and "qkv's training phase" in mfu_line


def test_no_train_measures_decoding_only(bench: Any, tmp_path: Path) -> None:
    options = ["--peers", "torch_nn", "--no-train", "--no-pair", "--beam", "0"]
    results, markdown = run(bench, tmp_path, *options)
    for name, system in results["systems"].items():
        assert system["train"] == {}, name
        assert system["decode"]["greedy"]["sentences_per_s"] > 0, name
        assert system["decode"]["peak_rss_mb_greedy"] > 0, name
    assert "Training: not measured (`--no-train`)." in markdown and "| qkv |" in markdown


def test_decoding_in_rounds_keeps_every_round(bench: Any, tmp_path: Path) -> None:
    options = ["--peers", "torch_nn", "--no-train", "--no-pair", "--decode-rounds", "2"]
    results, markdown = run(bench, tmp_path, *options)
    for name, system in results["systems"].items():
        greedy = system["decode"]["greedy"]
        assert system["decode"]["rounds"] == 2 and len(greedy["rounds"]) == 2, name
        one = greedy["ways"]["one"]
        assert len(one["seconds"]) == 2  # one timed pass a round
        assert one["sentences_per_s"] == pytest.approx(2 / statistics.median(one["seconds"]))
    assert len(results["systems"]["qkv"]["decode"]["beam"]["rounds"]) == 2
    assert "round by round" in markdown and "median of every pass of 2 round(s)" in markdown


def test_rounds_alternate_the_order_with_the_qkvs_beside_hugging_face(
    bench: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def fake_phase(phase: str, args: object, system: str) -> dict[str, object]:
        calls.append(system)
        speed = {"qkv": 4.0, "hf_marian": 2.0}.get(system, 1.0) * len(calls)
        ways = {"one": {"seconds": [8 / speed], "sentences_per_s": speed}}
        return {"sentences": 8, "greedy": {"ways": ways, "headline": "one"}}

    monkeypatch.setattr(bench, "run_phase", fake_phase)
    args = bench.parse(["--decode-rounds", "3", "--baseline", str(ROOT), "--baseline-label", "b"])
    merged = bench.decode_in_rounds(args, ["qkv", "qkv@b", "torch_nn", "hf_marian"])
    order = ["qkv", "qkv@b", "hf_marian", "torch_nn"]
    assert calls == [*order, *order[::-1], *order]
    assert merged["qkv"]["greedy"]["rounds"] == [4.0, 32.0, 36.0]
    assert merged["qkv"]["greedy"]["sentences_per_s"] == pytest.approx(32.0)  # the median pass


def test_merge_rounds_takes_medians_highest_peaks_and_any_contention(bench: Any) -> None:
    def phase(seconds: list[float], peak: float, contended: bool) -> dict[str, object]:
        ways = {
            "split": {"seconds": seconds, "sentences_per_s": 6 / statistics.median(seconds)},
            "one": {"seconds": [x * 2 for x in seconds], "sentences_per_s": 1.0},
        }
        return {
            "sentences": 6,
            "greedy": {"ways": ways, "headline": "split", "sentences_per_s": 0.0},
            "beam": {"ways": {"one": ways["one"]}, "headline": "one", "k": 5},
            "peak_rss_mb": peak,
            "probe_gflops": [100.0],
            "contended": contended,
            "wall_s": 2.0,
        }

    merged = bench.merge_rounds([phase([1.0, 2.0], 300.0, False), phase([3.0, 6.0], 350.0, True)])
    split = merged["greedy"]["ways"]["split"]
    assert split["seconds"] == [1.0, 2.0, 3.0, 6.0]
    assert merged["greedy"]["sentences_per_s"] == split["sentences_per_s"] == pytest.approx(2.4)
    assert merged["greedy"]["rounds"] == [4.0, pytest.approx(6 / 4.5)]
    assert merged["greedy"]["ways"]["one"]["sentences_per_s"] == pytest.approx(1.2)
    assert merged["beam"]["k"] == 5 and merged["beam"]["sentences_per_s"] == pytest.approx(1.2)
    assert merged["peak_rss_mb"] == 350.0 and merged["contended"] and merged["wall_s"] == 4.0
    assert merged["probe_gflops"] == [100.0, 100.0] and merged["rounds"] == 2
    failed = {"error": "boom"}
    assert bench.merge_rounds([phase([1.0], 1.0, False), failed]) is failed


def test_cuda_without_a_gpu_is_refused(bench: Any) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(SystemExit, match="no CUDA device"):
        bench.main([*TINY, "--device", "cuda"])


def test_qkv_gpu_training_step_trains_like_the_generic_step(bench: Any) -> None:
    """The step `bench.py --device cuda` times for qkv (padded to bucket shapes, recorded as
    CUDA graphs), run eagerly here: the losses of the generic step, from the same weights."""
    import dataclasses

    from phases import step_function
    from qkv_side import QkvSystem
    from workload import SHAPES, make_train_batches

    shape = dataclasses.replace(SHAPES["tiny"], dropout=0.0)
    systems = []
    for _ in range(2):
        torch.manual_seed(0)
        systems.append(QkvSystem(shape))
    graphed = systems[0].graphed_step_function(1e-3, None)
    generic, _ = step_function(systems[1], 1e-3)
    assert (
        graphed is not None
        and QkvSystem(shape, cuda_graphs=False).graphed_step_function(1e-3, None) is None
    )
    for batch in make_train_batches(4, 60, 3, shape):
        tensors = {k: torch.from_numpy(v) for k, v in batch.items()}
        assert graphed(tensors) == pytest.approx(generic(tensors), rel=1e-4)
