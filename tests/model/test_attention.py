import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qkv.model.attention import (
    MultiHeadAttention,
    cached_attention,
    eager_attention,
    short_attention,
)
from qkv.model.masks import padding_mask
from qkv.fast.packed_attention import SHORT


def test_cross_attention_shapes_from_the_tutorial() -> None:
    attn = MultiHeadAttention(d_model=300, n_heads=6)
    query = torch.randn(64, 12, 300)
    memory = torch.randn(64, 10, 300)
    out, weights = attn(query, memory, memory)
    assert out.shape == (64, 12, 300)
    assert weights is None
    out, weights = attn(query, memory, memory, need_weights=True)
    assert weights is not None and weights.shape == (64, 6, 12, 10)
    torch.testing.assert_close(weights.sum(-1), torch.ones(64, 6, 12))


def test_rejects_indivisible_heads() -> None:
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(d_model=10, n_heads=3)
    with pytest.raises(ValueError, match="n_heads must be at least 1"):
        MultiHeadAttention(d_model=16, n_heads=0)


@pytest.mark.parametrize(
    ("query", "key", "value", "match"),
    [
        ((2, 3, 8), (2, 4, 16), (2, 4, 16), "D = d_model = 16"),
        ((3, 16), (3, 16), (3, 16), r"\(B, L, D\)"),
        ((2, 3, 16), (2, 7, 16), (2, 6, 16), "key and value one length"),
        ((2, 3, 16), (1, 4, 16), (1, 4, 16), "one batch size"),
    ],
)
def test_rejects_inputs_of_the_wrong_shape(
    query: tuple[int, ...], key: tuple[int, ...], value: tuple[int, ...], match: str
) -> None:
    attn = MultiHeadAttention(16, 2)
    for need_weights in (False, True):
        with pytest.raises(ValueError, match=match):
            attn(torch.randn(query), torch.randn(key), torch.randn(value), None, need_weights)


def test_rejects_a_mask_that_is_not_boolean() -> None:
    # A float 0/1 mask would be added to the scores by the fused kernel: attending everywhere.
    attn = MultiHeadAttention(16, 2)
    x = torch.randn(2, 3, 16)
    mask = padding_mask(torch.tensor([[1, 1, 0], [1, 0, 0]]), 0)
    for need_weights in (False, True):
        with pytest.raises(TypeError, match="mask must be boolean"):
            attn(x, x, x, mask.float(), need_weights)


@pytest.mark.parametrize("cross", [False, True])
def test_weights_path_equals_fast_path(cross: bool) -> None:
    attn = MultiHeadAttention(32, 4).eval()
    x = torch.randn(3, 7, 32)
    memory = torch.randn(3, 5, 32) if cross else x
    ids = torch.tensor([[1] * 5, [1] * 3 + [0] * 2, [1] * 1 + [0] * 4])
    mask = padding_mask(ids, 0) if cross else None
    fast, _ = attn(x, memory, memory, mask)
    eager, weights = attn(x, memory, memory, mask, need_weights=True)
    torch.testing.assert_close(fast, eager, atol=1e-5, rtol=1e-5)
    assert weights is not None
    if cross:
        assert mask is not None
        assert torch.all(weights.masked_select(~mask.expand_as(weights)) == 0)


def test_separate_key_and_value_inputs() -> None:
    attn = MultiHeadAttention(16, 2).eval()
    q, k, v = torch.randn(2, 3, 16), torch.randn(2, 4, 16), torch.randn(2, 4, 16)
    fast, _ = attn(q, k, v)
    eager, _ = attn(q, k, v, need_weights=True)
    torch.testing.assert_close(fast, eager, atol=1e-5, rtol=1e-5)


def test_equals_torch_multihead_attention() -> None:
    ours = MultiHeadAttention(32, 4).eval()
    reference = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    with torch.no_grad():
        reference.in_proj_weight.copy_(ours.in_proj.weight)
        reference.in_proj_bias.copy_(ours.in_proj.bias)
        reference.out_proj.weight.copy_(ours.out_proj.weight)
        reference.out_proj.bias.copy_(ours.out_proj.bias)
    x, memory = torch.randn(2, 6, 32), torch.randn(2, 9, 32)
    key_padding = torch.zeros(2, 9, dtype=torch.bool)
    key_padding[1, 6:] = True  # torch: True = ignore
    for query, kv in ((x, x), (x, memory)):
        mask = None if kv is x else ~key_padding[:, None, None, :]
        expected, expected_weights = reference(
            query,
            kv,
            kv,
            key_padding_mask=None if kv is x else key_padding,
            average_attn_weights=False,
        )
        ours_out, ours_weights = ours(query, kv, kv, mask, need_weights=True)
        fast_out, _ = ours(query, kv, kv, mask)
        torch.testing.assert_close(ours_out, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fast_out, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours_weights, expected_weights, atol=1e-5, rtol=1e-5)


def test_fully_masked_rows_are_finite_zeros() -> None:
    attn = MultiHeadAttention(16, 2).eval()
    x = torch.randn(2, 3, 16)
    mask = torch.ones(2, 1, 1, 3, dtype=torch.bool)
    mask[1] = False
    for need_weights in (False, True):
        out, _ = attn(x, x, x, mask, need_weights=need_weights)
        assert torch.isfinite(out).all()
        # nothing to attend to: the context is zero, so the output is the output bias
        torch.testing.assert_close(out[1], attn.out_proj.bias.expand(3, 16))


@pytest.mark.parametrize("layout", ["row-major", "step-major"])
@pytest.mark.parametrize("queries", [1, 5])
def test_eager_attention_equals_the_fused_kernel_on_cache_slices(queries: int, layout: str) -> None:
    q = torch.randn(3, 2, queries, 8)
    if layout == "row-major":  # cache buffers (B, H, S_max, K)
        keys, values = torch.randn(3, 2, 10, 8), torch.randn(3, 2, 10, 8)
    else:  # (B, H, S_max, K) views of (S_max, B, H, K) buffers
        keys, values = (torch.randn(10, 3, 2, 8).permute(1, 2, 0, 3) for _ in range(2))
    k, v = keys[:, :, :6], values[:, :, :6]  # the filled steps: a strided view
    mask = torch.ones(3, 1, 1, 6, dtype=torch.bool)
    mask[1, ..., 4:] = False
    mask[2] = False  # nothing to attend to
    got, weights = eager_attention(q, k, v, mask)
    assert torch.all(got[2] == 0) and torch.all(weights[2] == 0)
    fused = torch.nn.functional.scaled_dot_product_attention(q[:2], k[:2], v[:2], mask[:2])
    torch.testing.assert_close(got[:2], fused, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("queries", [1, 5])
def test_cached_attention_is_eager_attention_to_the_bit(queries: int) -> None:
    q = torch.randn(3, 2, queries, 8)
    keys, values = (torch.randn(10, 3, 2, 8).permute(1, 2, 0, 3) for _ in range(2))
    k, v = keys[:, :, :6], values[:, :, :6]  # step-major cache slices
    mask = torch.ones(3, 1, 1, 6, dtype=torch.bool)
    mask[1, ..., 4:] = False
    mask[2] = False  # nothing to attend to
    bias = torch.zeros(3, 2, 1, 6).masked_fill_(~mask, float("-inf")).flatten(0, 1)  # (B * H, 1, S)
    expected, _ = eager_attention(q, k, v, mask)
    assert torch.equal(cached_attention(q, k, v, bias, guard=True), expected)
    assert cached_attention(q, k, v, bias)[2].isnan().all()  # unguarded: NaN, not zeros
    assert torch.equal(cached_attention(q, k, v), eager_attention(q, k, v, None)[0])


@pytest.mark.parametrize("kind", ["self", "causal", "cross", "empty source", "long"])
def test_short_attention_equals_the_fused_kernel_forward_and_backward(kind: str) -> None:
    torch.manual_seed(0)
    length = SHORT + 3 if kind == "long" else 7
    keys = 5 if kind in ("cross", "empty source") else length
    q = torch.randn(3, 2, length, 8, requires_grad=True)
    k, v = (torch.randn(3, 2, keys, 8, requires_grad=True) for _ in range(2))
    mask = torch.ones(3, 1, 1, keys, dtype=torch.bool)
    mask[1, ..., 3:] = False  # padding keys
    if kind == "causal":
        mask = mask & torch.ones(length, length, dtype=torch.bool).tril()
    if kind == "empty source":
        mask[2] = False  # nothing to attend to
    grad = torch.randn(3, 2, length, 8)
    results = []
    for attend in (short_attention, F.scaled_dot_product_attention):
        out = attend(q, k, v, mask)
        out.backward(grad)
        results.append((out, q.grad, k.grad, v.grad))
        q.grad = k.grad = v.grad = None
    for ours, fused in zip(*results, strict=True):
        assert torch.isfinite(ours).all()
        torch.testing.assert_close(ours, fused, atol=1e-5, rtol=1e-5)
