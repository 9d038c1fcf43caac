"""`frozen_for_decoding`: decoding steps of the reference's numbers, its parameters shared."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from qkv.fast.decoding import StepAttention, StepFeedForward, frozen_for_decoding
from qkv.fast.frozen_linear import FrozenLinear
from qkv.model.attention import MultiHeadAttention
from qkv.model.layers import FeedForward
from qkv.model.masks import causal_mask, padding_mask
from qkv.model.seq2seq import Seq2SeqTransformer
from tests.model.helpers import random_ids, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


def decode(model: Seq2SeqTransformer, src: Tensor, tgt: Tensor, order: Tensor | None) -> Tensor:
    """Logits (N, T, V) of every step, the rows reordered by `order` after the second."""
    memory, src_mask, _ = model.encode(src)
    cache = model.init_cache(memory, src_mask, max_len=tgt.size(1))
    steps = []
    for t in range(tgt.size(1)):
        if t == 2 and order is not None:
            cache.select(order)
            tgt, steps = tgt[order], [step[order] for step in steps]
        steps.append(model.decode_step(tgt[:, t], cache))
    return torch.stack(steps, dim=1)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("rows", [3, 70])
@pytest.mark.parametrize("reorder", [False, True])
def test_frozen_model_decodes_as_the_reference(norm_first: bool, rows: int, reorder: bool) -> None:
    model = Seq2SeqTransformer(tiny_config(norm_first=norm_first)).eval()
    src, tgt = random_ids(rows, 6), random_ids(rows, 5)
    src[1, 4:] = 0
    src[2] = 0  # a source with no real token: cross-attention's context is zero, both ways
    order = torch.tensor([2, 0, 0, *range(3, rows)]) if reorder else None  # as beams do
    with torch.inference_mode():
        expected = decode(model, src, tgt, order)
        got = decode(frozen_for_decoding(model), src, tgt, order)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    if not reorder:
        torch.testing.assert_close(got, model(src, tgt), atol=1e-5, rtol=1e-5)


def test_the_copy_shares_the_parameters_and_leaves_the_model_as_it_was() -> None:
    model = Seq2SeqTransformer(tiny_config()).eval()
    before = [type(m) for m in model.modules()]
    twin = frozen_for_decoding(model)
    assert [type(m) for m in model.modules()] == before
    assert twin.encoder is model.encoder and twin.output is model.output
    assert [id(p) for p in twin.parameters()] == [id(p) for p in model.parameters()]
    kinds = {type(m) for m in twin.decoder.modules()}
    assert {StepAttention, StepFeedForward, FrozenLinear} <= kinds
    assert not kinds & {MultiHeadAttention, FeedForward}


def test_steps_reorder_what_runs_every_step_not_the_sources_keys_values() -> None:
    model = Seq2SeqTransformer(tiny_config()).eval()
    twin = frozen_for_decoding(model)
    src, tgt = random_ids(8, 6), random_ids(8, 1)
    with torch.inference_mode():
        memory, src_mask, _ = twin.encode(src)
        twin.decode_step(tgt[:, 0], twin.init_cache(memory, src_mask, max_len=2))
    width = model.config.d_model
    for layer in twin.decoder.layers:
        cross = layer.cross_attn.in_proj
        assert isinstance(cross, FrozenLinear) and isinstance(layer.self_attn.in_proj, FrozenLinear)
        assert list(cross._parts) == [(0, width)]  # the queries' rows alone


@pytest.mark.parametrize("case", ["one query", "weights", "several queries", "training"])
def test_step_attention_gives_the_reference_numbers_where_it_falls_back_or_not(case: str) -> None:
    reference = MultiHeadAttention(16, 2).eval()
    step = MultiHeadAttention(16, 2).eval()
    step.load_state_dict(reference.state_dict())
    step.__class__ = StepAttention
    step._biases = {}
    queries = 3 if case == "several queries" else 1
    x, memory = torch.randn(2, queries, 16), torch.randn(2, 5, 16)
    mask = padding_mask(torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]), 0)
    if case == "several queries":
        mask = mask & causal_mask(5)[..., 2:, :]  # (B, 1, 3, 5)
    for m in (reference, step):
        m.train(case == "training")
    need_weights = case == "weights"
    expected = reference(x, memory, memory, mask, need_weights)
    got = step(x, memory, memory, mask, need_weights)
    torch.testing.assert_close(got[0], expected[0], atol=1e-6, rtol=1e-5)
    assert (got[1] is None) == (expected[1] is None)
    unmasked = step(x, memory, memory)[0]
    torch.testing.assert_close(unmasked, reference(x, memory, memory)[0], atol=1e-6, rtol=1e-5)
