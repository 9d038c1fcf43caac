"""Fixed-shape caches: every step at the same shapes, the numbers of the growing cache's."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from qkv.inference.graphed import (
    StaticDecoderCache,
    init_static_cache,
    static_step,
)
from qkv.model.seq2seq import Seq2SeqTransformer
from tests.model.helpers import random_ids, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(params=[False, True], ids=["post-norm", "pre-norm"])
def model(request: pytest.FixtureRequest) -> Seq2SeqTransformer:
    return Seq2SeqTransformer(tiny_config(norm_first=request.param)).eval()


def step(model: Seq2SeqTransformer, tokens: Tensor, cache: StaticDecoderCache) -> Tensor:
    """One step as a fixed-shape decoder takes it: every row computed, the position set."""
    padded = torch.zeros(cache.rows, dtype=torch.long)
    padded[: len(tokens)] = tokens
    cache.position.fill_(cache.length)
    logits = static_step(model, padded, cache)[: len(tokens)]  # (N, V)
    cache.length += 1
    return logits


def test_static_steps_equal_the_growing_cache_and_the_full_forward(
    model: Seq2SeqTransformer,
) -> None:
    src, tgt = random_ids(3, 6), random_ids(3, 5)
    src[1, 4:], src[2] = 0, 0  # padding, and a source with no real token
    with torch.inference_mode():
        memory, src_mask, _ = model.encode(src)
        static = init_static_cache(model, memory, src_mask, max_len=5, rows=5)
        cache = model.init_cache(memory, src_mask, max_len=5)
        got, expected = [], []
        for t in range(5):
            got.append(step(model, tgt[:, t], static))
            expected.append(model.decode_step(tgt[:, t], cache))
    torch.testing.assert_close(torch.stack(got, 1), torch.stack(expected, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.stack(got, 1), model(src, tgt), atol=1e-5, rtol=1e-5)


def test_select_reorders_rows_as_the_growing_cache_does(
    model: Seq2SeqTransformer,
) -> None:
    src, tgt = random_ids(2, 6), random_ids(4, 4)
    with torch.inference_mode():
        memory, src_mask, _ = model.encode(src)
        static = init_static_cache(model, memory, src_mask, max_len=4, rows=4)
        cache = model.init_cache(memory, src_mask, max_len=4)
        expand = torch.tensor([0, 0, 1, 1])  # beam expansion: two rows per source
        step(model, tgt[:2, 0], static)
        model.decode_step(tgt[:2, 0], cache)
        static.select(expand)
        cache.select(expand)
        reorder = torch.tensor([1, 0, 3, 2])  # within each source
        for t in range(1, 4):
            got = step(model, tgt[:, t], static)
            torch.testing.assert_close(
                got, model.decode_step(tgt[:, t], cache), atol=1e-5, rtol=1e-5
            )
            static.select(reorder)
            cache.select(reorder)


def test_bad_sizes_are_refused(model: Seq2SeqTransformer) -> None:
    memory, src_mask, _ = model.encode(random_ids(3, 4))
    with pytest.raises(ValueError, match="rows >= batch"):
        init_static_cache(model, memory, src_mask, max_len=3, rows=2)
    with pytest.raises(ValueError, match="exceed the model's max_len"):
        init_static_cache(model, memory, src_mask, max_len=65, rows=3)
    static = init_static_cache(model, memory, src_mask, max_len=3, rows=3)
    with pytest.raises(RuntimeError, match="4 rows asked of a cache made for 3"):
        static.select(torch.tensor([0, 1, 2, 2]))
