"""The CTranslate2 peers: qkv's model as `qkv export` converts it, decoding only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.benchmarks.test_bench_smoke import BENCH_DIR, run, with_threads

pytest.importorskip("ctranslate2", reason="the CTranslate2 peers need pip install ctranslate2")


def sources(count: int) -> torch.Tensor:
    from workload import SHAPES, make_sources, pad_batch

    return torch.from_numpy(pad_batch(make_sources(count, 5, SHAPES["tiny"])))


def built(name: str, split: int = 1) -> Any:
    """Peer `name` of the tiny shape, seeded as the phases seed every system."""
    from peers import build_peer
    from workload import SHAPES

    torch.manual_seed(1234)
    return build_peer(name, SHAPES["tiny"], "cpu", split)


def favour_eos(model: torch.nn.Module) -> None:
    """Make EOS the decoder's first choice at every step by far: a search that let it through
    would end there. The last layer norm's bias puts 10 on one coordinate, which only EOS's
    output row reads (x 10)."""
    from workload import EOS

    with torch.no_grad():
        model.decoder.layers[-1].ffn_norm.bias[0] = 10.0
        model.output.weight[EOS] = 0.0
        model.output.weight[EOS, 0] = 10.0


def test_float32_decodes_exactly_n_tokens_as_qkv_does_on_the_same_weights(bench: Any) -> None:
    """Greedy search with EOS never chosen, on a model that prefers EOS above all: CTranslate2's
    float32 tokens are qkv's own search's on the same weights (the qkv side's, seeded alike),
    token for token, n of them."""
    from peers import CTranslate2Peer
    from qkv_side import QkvSystem, model_config
    from workload import BOS, EOS, SHAPES

    from qkv.model import Seq2SeqTransformer

    shape = SHAPES["tiny"]
    torch.manual_seed(1234)
    qkv = QkvSystem(shape, cuda_graphs=False)
    seeded = built("ct2_float32")
    weights = zip(qkv.model.state_dict().values(), seeded.model.state_dict().values(), strict=True)
    for mine, theirs in weights:
        assert torch.equal(mine, theirs)  # the same weights: seeded like the other systems

    torch.manual_seed(1234)
    model = Seq2SeqTransformer(model_config(shape))
    favour_eos(model)
    favour_eos(qkv.model)
    qkv.model.eval()
    peer = CTranslate2Peer(shape, model=model)
    src, n = sources(6), 12
    with torch.inference_mode():
        assert bool((qkv.model(src, torch.full((6, 1), BOS)).argmax(-1) == EOS).all())
        expected = qkv.greedy(src, n)
    found = peer.greedy(src, n)
    assert found.shape == (6, n) and found.dtype == torch.long
    assert not (found == EOS).any()
    assert torch.equal(found, expected)
    beam = peer.beam(src, n, 3)
    assert beam.shape == (6, n) and not (beam == EOS).any()
    assert peer.weights_dtype == "ctranslate2 float32"


def test_int8_decodes_exactly_n_tokens(bench: Any) -> None:
    from workload import EOS, SHAPES

    peer = built("ct2_int8")
    for found in (peer.greedy(sources(5), 7), peer.beam(sources(5), 7, 2)):
        assert found.shape == (5, 7) and not (found == EOS).any()
        assert int(found.min()) >= 0 and int(found.max()) < SHAPES["tiny"].tgt_vocab
    assert "int8" in peer.weights_dtype and "quantization int8" in peer.meta["impl"]


def test_the_split_way_takes_the_translator_of_one_thread_a_replica(bench: Any) -> None:
    """In `map_split`'s worker threads (one torch thread each) the translator of 2 replicas of
    1 thread, on the caller's threads the one of 1 replica on both; the same tokens either way.
    Making the translators leaves the caller's torch threads as they were."""
    from peers import trainable
    from phases import map_split

    assert not trainable("ct2_float32") and not trainable("ct2_int8")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        peer = built("ct2_float32", split=2)
        assert torch.get_num_threads() == 2
        assert peer.meta["threads"] == (
            "one: Translator(inter_threads=1, intra_threads=2); "
            "split: Translator(inter_threads=2, intra_threads=1)"
        )
        batches = [sources(3), sources(4), sources(5)]
        found = list(map_split(lambda i: (peer.layout(), peer.greedy(batches[i], 4)), 3, 2))
    finally:
        torch.set_num_threads(threads)
    assert [way for way, _ in found] == ["split", "split", "one"]
    for batch, (_, tokens) in zip(batches, found, strict=True):
        assert torch.equal(tokens, peer.greedy(batch, 4))
    assert built("ct2_float32").translators.keys() == {"one"}  # no split: one translator


def test_the_harness_decodes_with_ct2_and_trains_the_others(bench: Any, tmp_path: Path) -> None:
    options = ["--peers", "torch_nn,ct2_float32,ct2_int8", "--sentences", "6"]
    results, markdown = run(bench, tmp_path, *options, base=with_threads(2))
    assert results["decode_only"] == ["ct2_float32", "ct2_int8"]
    assert list(results["systems"]) == ["qkv", "torch_nn", "ct2_float32", "ct2_int8"]
    for name in ("ct2_float32", "ct2_int8"):
        system = results["systems"][name]
        assert system["train"] == {}, name  # no training phase
        decode = system["decode"]
        assert list(decode["greedy"]["ways"]) == ["split", "one"], name
        assert decode["greedy"]["headline"] == "split", name
        assert list(decode["beam"]["ways"]) == ["one"], name
        assert decode["greedy"]["sentences_per_s"] > 0 and decode["beam"]["sentences_per_s"] > 0
        assert decode["weights"].startswith("ctranslate2 "), name
        assert "split: Translator(inter_threads=2, intra_threads=1)" in decode["meta"]["threads"]
        assert str(BENCH_DIR.parent / "src" / "qkv") in decode["meta"]["export"]
        assert f"| {name} | — | decode only | — |" in markdown
        assert f"| **qkv / {name}** |" in markdown
    # the training pair and the best peer's training figures: a peer that trains
    assert [p["b"] for p in results["pairs"] if p["pair_part"] == "train"] == ["torch_nn"]
    best = next(line for line in markdown.splitlines() if line.startswith("| **qkv / best peer**"))
    assert best.split("|")[3].strip().endswith("(torch_nn)")
    assert "CTranslate2, decoding only" in markdown and "ctranslate2 " in markdown
