"""The fixed-shape decoder: its steps, run eagerly on the CPU, decode what the reference
decoding decodes. (The same steps replayed as CUDA graphs are checked in tests/test_cuda.py.)"""

from __future__ import annotations

import pytest
import torch

from qkv.data.special import BOS_ID, PAD_ID
from qkv.inference.beam import beam_search
from qkv.inference.graphed import StaticDecoder, make_decoder
from qkv.inference.incremental import ModelDecoder
from qkv.inference.search import greedy_search, sample
from qkv.inference.translate import DecodeOptions, translate_ids
from qkv.model.seq2seq import Seq2SeqTransformer
from tests.inference.helpers import ReferenceDecoder, fast_copy, tokens_of
from tests.model.helpers import random_ids, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


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
    ids[1, 4:] = PAD_ID
    ids[3, 2:] = PAD_ID
    ids[4] = PAD_ID  # no real token at all
    return ids  # (B, S)


MAX_LENGTHS = torch.tensor([5, 12, 1, 20, 9, 8])


@torch.inference_mode()
@pytest.mark.parametrize("fast_modules", [False, True], ids=["reference", "fast"])
def test_steps_compute_the_reference_logits_through_expansion_reorder_and_drops(
    model: Seq2SeqTransformer, src: torch.Tensor, fast_modules: bool
) -> None:
    """Also for the model turned fast by `qkv.fast.apply`, as `Translator.load` gives it."""
    static = StaticDecoder(fast_copy(model) if fast_modules else model, src, 6, 12, graph=False)
    expected = ReferenceDecoder(model, src, 6)
    tokens = torch.full((6,), BOS_ID)  # (N,)
    for rows in (
        torch.arange(6).repeat_interleave(2),  # beams of 2
        torch.tensor([1, 0, 2, 2, 5, 4, 6, 6, 9, 8, 11, 10]),  # siblings swap and copy
        torch.tensor([0, 1, 4, 5, 8, 9]),  # sentences 1, 3 and 5 done
        torch.tensor([3, 0, 0, 4, 5, 5]),
        torch.tensor([2]),
    ):
        torch.testing.assert_close(static.step(tokens), expected.step(tokens), atol=1e-5, rtol=1e-5)
        for decoder in (static, expected):
            decoder.select(rows)
        tokens = random_ids(len(rows), 1, vocab=60)[:, 0]  # (N',)


@torch.inference_mode()
@pytest.mark.parametrize("beam_size", [1, 3, 5])
def test_beam_search_finds_what_the_reference_finds(
    model: Seq2SeqTransformer, src: torch.Tensor, beam_size: int
) -> None:
    static_decoder = StaticDecoder(model, src, 21, src.size(0) * beam_size, graph=False)
    expected = beam_search(ReferenceDecoder(model, src, 21), 6, beam_size, MAX_LENGTHS)
    static = beam_search(static_decoder, 6, beam_size, MAX_LENGTHS)
    assert tokens_of(static) == tokens_of(expected)
    for found, others in zip(static, expected, strict=True):
        for a, b in zip(found, others, strict=True):
            assert a.score == pytest.approx(b.score, abs=1e-4)


@torch.inference_mode()
def test_greedy_search_and_sampling_find_what_the_reference_finds(
    model: Seq2SeqTransformer, src: torch.Tensor
) -> None:
    expected = greedy_search(ReferenceDecoder(model, src, 21), 6, MAX_LENGTHS)
    assert greedy_search(StaticDecoder(model, src, 21, 6, graph=False), 6, MAX_LENGTHS) == (
        expected
    )
    drawn = [
        sample(decoder, 6, MAX_LENGTHS, top_k=5, generator=torch.Generator().manual_seed(2))
        for decoder in (ReferenceDecoder(model, src, 21), StaticDecoder(model, src, 21, 6, False))
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
