"""The fixed-shape decoder: its steps, run eagerly on the CPU, decode what `ModelDecoder`
decodes. (The same steps replayed as CUDA graphs are checked in tests/test_cuda.py.)"""

from __future__ import annotations

import pytest
import torch

from qkv.inference.beam import beam_search
from qkv.inference.graphed import StaticDecoder, make_decoder
from qkv.inference.incremental import ModelDecoder
from qkv.inference.search import greedy_search, sample
from qkv.inference.translate import DecodeOptions, translate_ids
from qkv.model.seq2seq import Seq2SeqTransformer
from tests.model.helpers import random_ids, tiny_config


@pytest.fixture(params=["post-norm", "pre-norm, learned positions"])
def model(request: pytest.FixtureRequest) -> Seq2SeqTransformer:
    torch.manual_seed(0)
    if request.param == "post-norm":
        return Seq2SeqTransformer(tiny_config(vocab_size=60, max_len=40)).eval()
    config = tiny_config(vocab_size=60, max_len=40, norm_first=True, positions="learned")
    return Seq2SeqTransformer(config).eval()


@pytest.fixture
def src() -> torch.Tensor:
    torch.manual_seed(1)
    ids = random_ids(6, 9, vocab=60)
    ids[1, 4:] = 0
    ids[3, 2:] = 0
    return ids  # (B, S)


MAX_LENGTHS = torch.tensor([5, 12, 3, 20, 1, 8])


@torch.inference_mode()
def test_steps_match_the_full_forward_through_expansion_reorder_and_drops(
    model: Seq2SeqTransformer, src: torch.Tensor
) -> None:
    decoder = StaticDecoder(model, src[:3], max_steps=6, rows=6, graph=False)
    sources = torch.arange(3)  # the source of each row in use
    history = torch.full((3, 1), 1)  # tokens fed so far, BOS first
    for rows in ([0, 0, 1, 1, 2, 2], [1, 0, 3, 3, 4, 5], [0, 1, 4, 5], [3, 0, 0], [2]):
        logits = decoder.step(history[:, -1])  # (N, V)
        full = model(src[:3][sources], history)[:, -1]  # (N, V)
        torch.testing.assert_close(logits, full, atol=1e-5, rtol=1e-5)
        index = torch.tensor(rows)
        decoder.select(index)
        sources = sources[index]
        history = torch.cat([history[index], random_ids(len(rows), 1, vocab=60)], dim=1)


@torch.inference_mode()
@pytest.mark.parametrize("beam_size", [1, 3, 5])
def test_beam_search_finds_what_model_decoder_finds(
    model: Seq2SeqTransformer, src: torch.Tensor, beam_size: int
) -> None:
    static_decoder = StaticDecoder(model, src, 21, src.size(0) * beam_size, graph=False)
    eager = beam_search(ModelDecoder(model, src, 21), 6, beam_size, MAX_LENGTHS)
    static = beam_search(static_decoder, 6, beam_size, MAX_LENGTHS)
    assert [[h.tokens for h in hyps] for hyps in static] == [
        [h.tokens for h in hyps] for hyps in eager
    ]
    for found, expected in zip(static, eager, strict=True):
        for a, b in zip(found, expected, strict=True):
            assert a.score == pytest.approx(b.score, abs=1e-4)


@torch.inference_mode()
def test_greedy_search_and_sampling_find_what_model_decoder_finds(
    model: Seq2SeqTransformer, src: torch.Tensor
) -> None:
    eager = ModelDecoder(model, src, 21)
    assert greedy_search(StaticDecoder(model, src, 21, 6, graph=False), 6, MAX_LENGTHS) == (
        greedy_search(eager, 6, MAX_LENGTHS)
    )
    drawn = [
        sample(decoder, 6, MAX_LENGTHS, top_k=5, generator=torch.Generator().manual_seed(2))
        for decoder in (ModelDecoder(model, src, 21), StaticDecoder(model, src, 21, 6, False))
    ]
    assert drawn[0] == drawn[1]


@torch.inference_mode()
def test_limits_are_errors(model: Seq2SeqTransformer, src: torch.Tensor) -> None:
    decoder = StaticDecoder(model, src, max_steps=2, rows=8, graph=False)
    with pytest.raises(RuntimeError, match="9 rows asked of a cache made for 8"):
        decoder.select(torch.zeros(9, dtype=torch.long))
    decoder.step(torch.ones(6, dtype=torch.long))
    decoder.step(torch.ones(6, dtype=torch.long))
    with pytest.raises(RuntimeError, match="2 steps were allowed"):
        decoder.step(torch.ones(6, dtype=torch.long))
    with pytest.raises(ValueError, match="exceed the model's max_len"):
        StaticDecoder(model, src, max_steps=41, rows=6, graph=False)
    with pytest.raises(ValueError, match="rows >= batch, got 5 < 6"):
        StaticDecoder(model, src, max_steps=2, rows=5, graph=False)


def test_the_cpu_decodes_eagerly_and_translates_alike(model: Seq2SeqTransformer) -> None:
    assert isinstance(make_decoder(model, random_ids(2, 3, vocab=60), 4, 10), ModelDecoder)
    sources = [random_ids(1, n, vocab=60)[0].tolist() for n in (3, 7, 1, 5)]
    graphs_off = DecodeOptions(beam_size=3, cuda_graphs=False)
    cpu = torch.device("cpu")
    assert translate_ids(model, sources, DecodeOptions(beam_size=3), cpu) == translate_ids(
        model, sources, graphs_off, cpu
    )
