"""The benchmark harness runs end to end on a tiny model and writes every field it reports."""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import pytest
import torch

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
TINY = [
    "--shape",
    "tiny",
    "--threads",
    "1",
    "--warmup",
    "1",
    "--steps",
    "1",
    "--repeats",
    "1",
    "--batch-tokens",
    "40",
    "--sentences",
    "2",
    "--infer-batch",
    "2",
    "--new-tokens",
    "3",
    "--decode-repeats",
    "1",
    "--beam",
    "2",
    "--inline",
    "--quiet-wait",
    "0",
    "--retries",
    "0",
    "--load-interval",
    "0.01",
    "--probe-size",
    "128",
]


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    for name in (
        "bench",
        "decode_phase",
        "gemm_cache",
        "frozen_ab",
        "peers",
        "phases",
        "profile_decode",
        "profile_step",
        "qkv_side",
        "report",
        "screen_ab",
        "step_parts",
        "train_ab",
        "workload",
        "workers_phase",
    ):
        sys.modules.pop(name, None)  # a fresh import under the patched path
    import bench as module

    return module


def test_qkv_side_and_installed_peers_report_every_field(bench: object, tmp_path: Path) -> None:
    from peers import PEERS, available

    out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
    bench.main(
        [
            *TINY,
            "--peers",
            ",".join(PEERS),
            "--json",
            str(out_json),  # type: ignore[attr-defined]
            "--md",
            str(out_md),
        ]
    )
    results = json.loads(out_json.read_text())
    installed = [p for p in PEERS if available(p)]
    assert results["skipped_peers"] == [p for p in PEERS if p not in installed]
    assert list(results["systems"]) == ["qkv", *installed]
    peak = results["peak"]
    measured = [*peak["gflops"].values(), *peak["onednn_gflops"].values()]
    assert peak["peak_gflops"] == max(measured) and peak["torch_mm_peak_gflops"] > 0
    if torch.backends.mkldnn.is_available():
        assert peak["onednn_gflops"] and "oneDNN" in out_md.read_text()  # type: ignore[attr-defined]

    qkv = results["systems"]["qkv"]
    assert qkv["train"]["params"]["non_embedding"] > 0
    for batches in ("identical", "bucketed"):
        run = qkv["train"][batches]
        assert run["tgt_tokens_per_s"] > 0 and run["tgt_tokens"] > 0 and run["loss_finite"]
    assert qkv["train"]["peak_rss_mb"] > 0
    assert qkv["decode"]["greedy"]["sentences_per_s"] > 0
    assert qkv["decode"]["beam"]["sentences_per_s"] > 0 and qkv["decode"]["beam"]["k"] == 2
    assert qkv["decode"]["sentences"] == 2 and qkv["decode"]["peak_rss_mb"] > 0
    for peer in installed:
        assert "error" not in results["systems"][peer]["train"], peer
        assert results["systems"][peer]["decode"]["greedy"]["sentences_per_s"] > 0

    assert sum(results["profile"]["category_pct"].values()) == pytest.approx(100.0)
    split = results["profile"]["decode_split"]
    assert list(split) == ["greedy", "beam-2"]
    for kind in split.values():
        parts = kind["parts_ms"]
        step = parts["model step (decoder layers + output layer)"]
        assert 0 < parts["    feed-forward"] < parts["  decoder layers"] < step < kind["step_ms"]
        assert parts["  output layer"] > 0
    assert split["beam-2"]["parts_ms"]["beam search step (log-softmax, top-k, bookkeeping)"] > 0
    if installed:  # torch_nn needs only torch, so there is always a peer to pair with
        parts = {p["pair_part"]: p for p in results["pairs"]}
        assert parts["train"]["train"]["ratio"] > 0
        assert parts["decode"]["decode"]["greedy"]["ratio"] > 0
    markdown = out_md.read_text()
    assert "| qkv |" in markdown and "train tok/s, identical batches" in markdown
    assert "### Where a qkv decoding step goes" in markdown


def test_workers_phase_decodes_each_system_both_ways(bench: object, tmp_path: Path) -> None:
    out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
    two_threads = [x if x != "1" or TINY[i - 1] != "--threads" else "2" for i, x in enumerate(TINY)]
    options = ["--peers", "torch_nn", "--no-pair", "--no-profile", "--sentences", "4"]
    bench.main([*two_threads, *options, "--json", str(out_json), "--md", str(out_md)])  # type: ignore[attr-defined]
    workers = json.loads(out_json.read_text())["workers"]
    assert workers["peer"] == "torch_nn" and workers["workers"] == 2 and workers["sentences"] == 4
    rows = workers["greedy"]
    assert [(r["system"], r["workers"], r["threads_each"]) for r in rows] == [
        ("qkv", 1, 2),
        ("qkv", 2, 1),
        ("torch_nn", 1, 2),
        ("torch_nn", 2, 1),
    ]
    assert all(r["sentences_per_s"] > 0 for r in rows)
    assert "beam" not in workers  # torch_nn has no beam search
    assert "### Decoding 2 batches at once, in worker threads of one thread" in out_md.read_text()


def test_bf16_trains_under_autocast_and_decodes_bf16_weights(bench: object, tmp_path: Path) -> None:
    """The bf16 path, on the CPU: every system trains under autocast and decodes with its
    weights in bf16, except x-transformers (float32 activations of its own: autocast)."""
    from peers import PEERS, available

    out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
    peers = [p for p in PEERS if available(p)]
    options = ["--dtype", "bf16", "--peers", ",".join(peers), "--no-pair", "--no-profile"]
    bench.main([*TINY, *options, "--json", str(out_json), "--md", str(out_md)])  # type: ignore[attr-defined]
    results = json.loads(out_json.read_text())
    assert results["peak"]["dtype"] == "torch.bfloat16" and results["peak"]["peak_gflops"] > 0
    for name, system in results["systems"].items():
        assert system["train"]["identical"]["loss_finite"], name
        assert system["decode"]["greedy"]["sentences_per_s"] > 0, name
        weights = "torch.float32" if name == "xtransformers" else "torch.bfloat16"
        assert system["decode"]["weights"] == weights, name
    assert "Device cpu, bf16 (training under torch.autocast, decoding with" in out_md.read_text()


def test_no_decode_measures_training_only(bench: object, tmp_path: Path) -> None:
    out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
    options = ["--peers", "torch_nn", "--no-decode", "--no-profile"]
    bench.main([*TINY, *options, "--json", str(out_json), "--md", str(out_md)])  # type: ignore[attr-defined]
    results = json.loads(out_json.read_text())
    for name, system in results["systems"].items():
        assert system["train"]["identical"]["tgt_tokens_per_s"] > 0, name
        assert system["decode"] == {}, name
    assert [p["pair_part"] for p in results["pairs"]] == ["train"]
    text = out_md.read_text()
    assert "| qkv |" in text
    # the interleaved MFU, with the pair phase's probes beside those of qkv's training phase
    mfu_line = next(line for line in text.splitlines() if "qkv MFU, interleaved" in line)
    assert "probes" in mfu_line and "qkv's training phase" in mfu_line


def test_no_train_measures_decoding_only(bench: object, tmp_path: Path) -> None:
    out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
    options = ["--peers", "torch_nn", "--no-train", "--no-profile", "--no-workers"]
    bench.main([*TINY, *options, "--json", str(out_json), "--md", str(out_md)])  # type: ignore[attr-defined]
    results = json.loads(out_json.read_text())
    for name, system in results["systems"].items():
        assert system["train"] == {}, name
        assert system["decode"]["greedy"]["sentences_per_s"] > 0, name
        assert system["decode"]["peak_rss_mb_greedy"] > 0, name
    assert [p["pair_part"] for p in results["pairs"]] == ["decode"]
    text = out_md.read_text()
    assert "Training: not measured (`--no-train`)." in text and "| qkv |" in text


def test_decoding_in_rounds_keeps_every_round(bench: object, tmp_path: Path) -> None:
    out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
    options = ["--peers", "torch_nn", "--no-train", "--no-profile", "--no-workers", "--no-pair"]
    rounds = ["--decode-rounds", "2"]
    bench.main([*TINY, *options, *rounds, "--json", str(out_json), "--md", str(out_md)])  # type: ignore[attr-defined]
    results = json.loads(out_json.read_text())
    for name, system in results["systems"].items():
        greedy = system["decode"]["greedy"]
        assert system["decode"]["rounds"] == 2 and len(greedy["rounds"]) == 2, name
        assert len(greedy["seconds"]) == 2  # one timed pass a round
        assert greedy["sentences_per_s"] == pytest.approx(2 / (sum(greedy["seconds"]) / 2))
    assert len(results["systems"]["qkv"]["decode"]["beam"]["rounds"]) == 2
    text = out_md.read_text()
    assert "round by round" in text and "median of every pass of 2 round(s)" in text


def test_rounds_alternate_the_order_with_qkv_beside_hugging_face(
    bench: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def fake_phase(phase: str, args: object, system: str) -> dict[str, object]:
        calls.append(system)
        speed = {"qkv": 4.0, "hf_marian": 2.0}.get(system, 1.0) * len(calls)
        return {"sentences": 8, "greedy": {"seconds": [8 / speed], "sentences_per_s": speed}}

    monkeypatch.setattr(bench, "run_phase", fake_phase)
    args = bench.parse(["--decode-rounds", "3"])  # type: ignore[attr-defined]
    merged = bench.decode_in_rounds(args, ["qkv", "torch_nn", "hf_marian"])  # type: ignore[attr-defined]
    order = ["qkv", "hf_marian", "torch_nn"]
    assert calls == [*order, *order[::-1], *order]
    assert merged["qkv"]["greedy"]["rounds"] == [4.0, 24.0, 28.0]
    assert merged["qkv"]["greedy"]["sentences_per_s"] == pytest.approx(24.0)  # the median pass


def test_merge_rounds_takes_medians_highest_peaks_and_any_contention(bench: object) -> None:
    def run(seconds: list[float], peak: float, contended: bool) -> dict[str, object]:
        timing = {"seconds": seconds, "sentences_per_s": 6 / statistics.median(seconds)}
        return {
            "sentences": 6,
            "greedy": timing,
            "beam": dict(timing, k=5),
            "peak_rss_mb": peak,
            "probe_gflops": [100.0],
            "contended": contended,
            "wall_s": 2.0,
        }

    merged = bench.merge_rounds([run([1.0, 2.0], 300.0, False), run([3.0, 6.0], 350.0, True)])  # type: ignore[attr-defined]
    assert merged["greedy"]["seconds"] == [1.0, 2.0, 3.0, 6.0]
    assert merged["greedy"]["sentences_per_s"] == pytest.approx(6 / 2.5)
    assert merged["greedy"]["rounds"] == [4.0, pytest.approx(6 / 4.5)] and merged["beam"]["k"] == 5
    assert merged["peak_rss_mb"] == 350.0 and merged["contended"] and merged["wall_s"] == 4.0
    assert merged["probe_gflops"] == [100.0, 100.0] and merged["rounds"] == 2
    failed = {"error": "boom"}
    assert bench.merge_rounds([run([1.0], 1.0, False), failed]) is failed  # type: ignore[attr-defined]


def test_cuda_without_a_gpu_is_refused(bench: object) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(SystemExit, match="no CUDA device"):
        bench.main([*TINY, "--device", "cuda"])  # type: ignore[attr-defined]


def test_gemm_cache_times_the_three_ways(bench: object, capsys: pytest.CaptureFixture[str]) -> None:
    import gemm_cache

    ways = gemm_cache.main(["--shape", "tiny", "--rows", "2", "--threads", "1"])
    assert len(ways) == 3
    assert ways["one at a time (summed)"] > 0 and ways["in sequence"] > 0
    assert "in sequence" in capsys.readouterr().out


@pytest.mark.parametrize(
    "change",
    [
        "decoder",
        "encoder",
        "kept",
        "query",
        "cache-attention",
        "int8-screen",
        "step-major",
        "held",
        "layer-step",
    ],
)
def test_frozen_ab_decodes_both_ways_and_puts_everything_back(
    bench: object, capsys: pytest.CaptureFixture[str], change: str
) -> None:
    import frozen_ab

    import qkv.inference.incremental as incremental
    import qkv.inference.output_layer as output_layer
    import qkv.model.attention as attention
    import qkv.model.seq2seq as seq2seq
    from qkv.inference.incremental import ModelDecoder
    from qkv.inference.output_layer import int8_matmuls_exact
    from qkv.model.attention import cached_attention
    from qkv.model.decoder import Decoder
    from qkv.fast.frozen_linear import FrozenLinear, frozen_copy
    from qkv.model.kv_cache import KVCache

    argv = ["--shape", "tiny", "--threads", "1", "--sentences", "8", "--infer-batch", "4"]
    argv += ["--new-tokens", "3", "--passes", "1", "--beam", "2", "--change", change]
    out = frozen_ab.main(argv)
    assert sorted(out) == ["beam-2", "greedy"]
    for figures in out.values():
        assert figures["sentences"] == 8 and 0 <= figures["same_outputs"] <= 8
        assert figures["on_sent_per_s"] > 0 and figures["off_sent_per_s"] > 0
    assert out["greedy"]["same_outputs"] == 8
    assert frozen_ab.CHANGES[change] in capsys.readouterr().out
    assert incremental.frozen_copy is frozen_copy and attention.FrozenLinear is FrozenLinear
    assert attention.cached_attention is cached_attention
    assert Decoder.step is Decoder.__dict__["step"]
    assert ModelDecoder.select is ModelDecoder.__dict__["select"]
    assert output_layer.int8_matmuls_exact is int8_matmuls_exact
    assert seq2seq.KVCache is KVCache


def test_screen_ab_decodes_both_ways_to_the_same_tokens(
    bench: object, capsys: pytest.CaptureFixture[str]
) -> None:
    import screen_ab

    from qkv.inference.output_layer import OutputLayer

    argv = ["--threads", "1", "--sentences", "8", "--infer-batch", "4", "--new-tokens", "3"]
    out = screen_ab.main([*argv, "--passes", "1"])
    assert out["sentences"] == 8 and out["same_tokens"] == 8
    assert out["screened_sent_per_s"] > 0 and out["float32_sent_per_s"] > 0
    assert "candidates per row" in capsys.readouterr().out
    assert OutputLayer._screened.__name__ == "_screened"  # the counter is taken off again


def test_screen_ab_times_single_calls_by_rows(
    bench: object, capsys: pytest.CaptureFixture[str]
) -> None:
    import screen_ab

    out = screen_ab.main(["--calls", "--repeats", "1", "--threads", "1"])
    assert sorted(map(int, out)) == sorted(screen_ab.CALL_ROWS)
    assert all(ms["screened"] > 0 and ms["float32"] > 0 for ms in out.values())
    assert "128 rows: screened" in capsys.readouterr().out


def test_decode_phase_measures_qkv_both_ways_beside_a_peer(
    bench: object, capsys: pytest.CaptureFixture[str]
) -> None:
    import decode_phase

    options = ["--device", "cpu", "--shape", "tiny", "--dtypes", "fp32", "--peer", "torch_nn"]
    sizes = ["--sentences", "4", "--infer-batch", "2", "--new-tokens", "3", "--beam", "2"]
    rows = decode_phase.main([*options, *sizes, "--decode-repeats", "1", "--probe-size", "64"])
    assert [r["system"] for r in rows] == ["qkv, graphs", "qkv, eager", "torch_nn"]
    assert all(r["greedy"] > 0 for r in rows)
    assert rows[0]["beam"] > 0 and rows[2]["beam"] is None  # torch_nn has no beam search
    out = capsys.readouterr().out
    assert "| fp32 | qkv, eager |" in out and "| fp32 | torch_nn |" in out


def test_qkv_gpu_training_step_trains_like_the_generic_step(bench: object) -> None:
    """The step `bench.py --device cuda` times for qkv (padded to bucket shapes, recorded as
    CUDA graphs), run eagerly here: the losses of the generic step, from the same weights."""
    import dataclasses

    import torch
    from phases import step_function
    from qkv_side import QkvSystem
    from workload import SHAPES, make_train_batches

    shape = dataclasses.replace(SHAPES["tiny"], dropout=0.0)
    systems = []
    for _ in range(2):
        torch.manual_seed(0)
        systems.append(QkvSystem(shape))
    graphed = systems[0].graphed_step_function(1e-3, None)
    generic = step_function(systems[1], 1e-3)
    assert (
        graphed is not None
        and QkvSystem(shape, cuda_graphs=False).graphed_step_function(1e-3, None) is None
    )
    for batch in make_train_batches(4, 60, 3, shape):
        tensors = {k: torch.from_numpy(v) for k, v in batch.items()}
        assert graphed(tensors) == pytest.approx(generic(tensors), rel=1e-4)


@pytest.mark.parametrize(
    ("change", "extra"),
    [
        ("linear", []),
        ("attention", []),
        ("optimizer", []),
        ("packed", []),
        ("packed", ["--bucketed"]),
        ("dropout", []),
        ("grouped", []),
        ("draws", []),
        ("hashed", []),
        ("loss", []),
        ("ffn", []),
    ],
)
def test_train_ab_trains_both_ways_and_puts_everything_back(
    bench: object, capsys: pytest.CaptureFixture[str], change: str, extra: list[str]
) -> None:
    import train_ab

    import qkv.model.attention as attention
    import qkv.fast.dropout as dropout
    import qkv.fast.fused_ffn as fused_ffn
    import qkv.fast.grid as grid
    import qkv.fast.linear as linear
    import qkv.fast.packed_attention as packed_attention
    import qkv.fast.packing as packing
    from qkv.training import fused_loss

    def switches() -> tuple[object, ...]:
        return (
            linear.applies,
            packed_attention.SHORT,
            packing.padded_rows,
            attention.packed_attention_applies,
            dropout.dropout,
            dropout._slices,
            dropout._hashed_applies,
            fused_loss.applies,
            fused_ffn.applies,
            grid.MAX_GROUPS,
        )

    kept = switches()
    argv = ["--shape", "tiny", "--threads", "1", "--steps", "2", "--warmup", "1", *extra]
    out = train_ab.main([*argv, "--batch-tokens", "200", "--change", change])
    assert out["tokens_per_s"]["on"] > 0 and out["tokens_per_s"]["off"] > 0
    # The packed ways draw their dropout masks over different row counts, and the draws' ways
    # differ in a bit of each word.
    tolerance = 5e-2 if change in ("packed", "draws") else 1e-3
    assert abs(out["last_loss"]["on"] - out["last_loss"]["off"]) < tolerance
    assert train_ab.CHANGES[change] in capsys.readouterr().out
    assert kept == switches()


def test_step_parts_times_each_part_within_the_step_and_puts_everything_back(
    bench: object, capsys: pytest.CaptureFixture[str]
) -> None:
    import qkv_side
    import step_parts

    import qkv.fast.dropout as dropout
    import qkv.fast.fused_ffn as fused_ffn
    import qkv.fast.linear as linear
    import qkv.fast.packed_attention as packed_attention

    def wrapped() -> tuple[object, ...]:
        return (
            fused_ffn._dropout_pass,
            fused_ffn._gradient_pass,
            linear._product,
            linear._weight_grad,
            vars(packed_attention._PackedAttention)["forward"],
            vars(packed_attention._PackedAttention)["backward"],
            packed_attention._to_grid,
            packed_attention.softmax,
            packed_attention.softmax_backward,
            dropout.dropout,
            vars(dropout._HashedDropout)["backward"],
            qkv_side.smoothed_cross_entropy,
        )

    kept = wrapped()
    argv = ["--shape", "tiny", "--threads", "1", "--warmup", "1", "--steps", "2"]
    parts = step_parts.main([*argv, "--batch-tokens", "200", "--peak", "100", "--isolated"])
    assert kept == wrapped()
    step = parts[step_parts.STEP]
    assert sum(parts[part] for part in step_parts.SPLIT) == pytest.approx(step, rel=1e-6)
    for part in step_parts.PARTS:
        if part in step_parts.ONLY_WHERE_HASHED:
            assert parts[part] == 0.0, part
        else:
            assert 0 < parts[part] < step, part
    assert parts[step_parts.WEIGHT_PRODUCTS] < parts[step_parts.PRODUCTS]
    assert 0 < parts[step_parts.PRODUCT_RATE] < math.inf
    assert 0 < parts[step_parts.ISOLATED] < math.inf
    assert parts[step_parts.GRID] < parts[step_parts.ATTENTION]
    assert parts[step_parts.SOFTMAX] < parts[step_parts.ATTENTION]
    assert 0 < parts[step_parts.MFU] < 100
    assert "| **whole step** |" in capsys.readouterr().out


def test_step_parts_with_torch_softmax_keeps_the_compiled_loops_out_and_puts_them_back(
    bench: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    import step_parts

    import qkv.fast.short_softmax as short_softmax

    calls: list[str] = []
    for name in ("_forward_kernel", "_backward_kernel"):
        monkeypatch.setattr(short_softmax, name, lambda name=name: calls.append(name))
    kept = short_softmax.SHORT_ROW
    argv = ["--shape", "tiny", "--threads", "1", "--warmup", "1", "--steps", "2"]
    parts = step_parts.main([*argv, "--batch-tokens", "200", "--peak", "100", "--torch-softmax"])
    assert calls == []
    assert kept == short_softmax.SHORT_ROW
    assert 0 < parts[step_parts.SOFTMAX] < parts[step_parts.ATTENTION]


def test_step_parts_counts_a_products_flops(bench: object) -> None:
    import step_parts

    x, weight = torch.zeros(6, 4), torch.zeros(5, 4)  # (m, k), (n, k): 2 m n k
    assert step_parts.product_flops(x.shape, weight.shape) == 2 * 6 * 5 * 4
    log = step_parts.ProductLog()
    log(x, weight)
    log(x, torch.zeros(4, 5).t(), None, "relu")  # a transposed view: its own entry
    log(x, weight)
    assert len(log.counts) == 2
    assert log.flops() == 3 * 2 * 6 * 5 * 4
