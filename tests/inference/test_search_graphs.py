"""Kept searches: batches of known shapes decode on kept decoders as on fresh ones (run eagerly
on the CPU; the GPU's replays are checked in tests/test_cuda.py through `translate_ids`)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from qkv.inference.beam import beam_search
from qkv.inference.graphed import StaticDecoder
from qkv.inference.incremental import DecodingWeights
from qkv.inference.search import greedy_search
from qkv.inference.search_graphs import SearchGraphs
from qkv.inference.translate import DecodeOptions, _decode_batch
from qkv.model.seq2seq import Seq2SeqTransformer
from tests.inference.helpers import decoder, tokens_of
from tests.model.helpers import random_ids, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def model() -> Seq2SeqTransformer:
    torch.manual_seed(0)
    return Seq2SeqTransformer(tiny_config(vocab_size=60, max_len=40)).eval()


class Counted(StaticDecoder):
    made = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        Counted.made += 1
        super().__init__(*args, **kwargs)


@torch.inference_mode()
def test_kept_searches_decode_new_batches_as_fresh_ones(model: Seq2SeqTransformer) -> None:
    """Batches of two padded shapes in turn (8 rows x 16 or 8 positions, 16 steps): each
    shape's decoder is made once, then loaded with the next batch's sources; padded rows and
    positions change nothing; the least recently used shape makes room for a new one."""
    graphs = SearchGraphs(model, max_entries=4, decoder_type=Counted)
    Counted.made = 0
    torch.manual_seed(3)
    for batch, length in [(5, 9), (3, 4), (6, 10), (3, 3), (5, 9)]:
        src = random_ids(batch, length, vocab=60)
        src[0, length // 2 :] = 0
        budgets = torch.randint(0, 14, (batch,))
        budgets[-1] = 13
        assert graphs.greedy(src, budgets) == greedy_search(
            decoder(model, src, 14, batch), batch, budgets
        )
        expected = beam_search(decoder(model, src, 14, batch * 3), batch, 3, budgets)
        assert tokens_of(graphs.beam(src, 3, budgets)) == tokens_of(expected)
    assert Counted.made == 4  # greedy and beam-3, each at two shapes
    graphs.greedy(random_ids(9, 4, vocab=60), torch.full((9,), 2))  # 16 rows: a new shape
    assert Counted.made == 5 and len(graphs.entries) == 4
    assert ("greedy", 1, 2, 1, 8, 8, 16) not in graphs.entries  # used least recently
    assert graphs.greedy(random_ids(0, 4, vocab=60), torch.zeros(0, dtype=torch.long)) == []
    kept = next(iter(graphs.entries.values()))
    with pytest.raises(ValueError, match="made for"):
        kept.decoder.load(random_ids(8, 9, vocab=60))


@torch.inference_mode()
def test_translate_batches_decode_alike_through_kept_searches(model: Seq2SeqTransformer) -> None:
    """`translate_ids`'s batch decoding with the kept searches (what a GPU gets), run eagerly
    here, against its host-driven searches (what the CPU gets)."""
    graphs = SearchGraphs(model)
    weights = DecodingWeights(model)
    seeds = list(range(5))  # one per sentence, for sampling only
    for beam_size in (1, 3):
        options = DecodeOptions(beam_size=beam_size)
        for seed in (4, 5):
            torch.manual_seed(seed)
            src = random_ids(5, 7, vocab=60)
            src[2, 3:] = 0
            expected = _decode_batch(model, src, options, seeds, None, weights)
            assert _decode_batch(model, src, options, seeds, graphs, weights) == expected
    assert len(graphs.entries) == 2
