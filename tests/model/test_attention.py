import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qkv.model.attention import MultiHeadAttention, scaled_dot_product_attention
from qkv.model.kv_cache import KVCache, SourceKV
from qkv.model.masks import causal_mask, padding_mask
from tests.model.helpers import overfit

pytestmark = pytest.mark.usefixtures("one_thread")


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
def test_weights_path_equals_fused_path(cross: bool) -> None:
    attn = MultiHeadAttention(32, 4).eval()
    x = torch.randn(3, 7, 32)
    memory = torch.randn(3, 5, 32) if cross else x
    ids = torch.tensor([[1] * 5, [1] * 3 + [0] * 2, [1] * 1 + [0] * 4])
    mask = padding_mask(ids, 0) if cross else causal_mask(7)
    fused, _ = attn(x, memory, memory, mask)
    eager, weights = attn(x, memory, memory, mask, need_weights=True)
    torch.testing.assert_close(fused, eager, atol=1e-5, rtol=1e-5)
    assert weights is not None
    assert torch.all(weights.masked_select(~mask.expand_as(weights)) == 0)


@pytest.mark.parametrize("cross", [False, True])
def test_weights_path_and_fused_path_give_the_same_gradients(cross: bool) -> None:
    attn = MultiHeadAttention(32, 4, dropout=0.0).train()
    x = torch.randn(3, 6, 32, requires_grad=True)
    memory = torch.randn(3, 5, 32, requires_grad=True) if cross else x
    mask = padding_mask(torch.tensor([[1] * 5, [1] * 2 + [0] * 3, [1] + [0] * 4]), 0)
    mask = mask if cross else causal_mask(6)
    grad = torch.randn(3, 6, 32)
    inputs = [x, memory, *attn.parameters()] if cross else [x, *attn.parameters()]
    results = []
    for need_weights in (False, True):
        out, _ = attn(x, memory, memory, mask, need_weights)
        results.append((out, *torch.autograd.grad(out, inputs, grad)))
    for fused, eager in zip(*results, strict=True):
        torch.testing.assert_close(fused, eager, atol=1e-5, rtol=1e-4)


def test_separate_key_and_value_inputs() -> None:
    attn = MultiHeadAttention(16, 2).eval()
    q, k, v = torch.randn(2, 3, 16), torch.randn(2, 4, 16), torch.randn(2, 4, 16)
    fused, _ = attn(q, k, v)
    eager, _ = attn(q, k, v, need_weights=True)
    torch.testing.assert_close(fused, eager, atol=1e-5, rtol=1e-5)
    changed, _ = attn(q, k, v + 1.0)  # the values are read from `value`, not from `key`
    assert not torch.allclose(changed, fused)


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
        fused_out, _ = ours(query, kv, kv, mask)
        torch.testing.assert_close(ours_out, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fused_out, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours_weights, expected_weights, atol=1e-5, rtol=1e-5)


def test_equals_torch_multihead_attention_under_a_causal_mask() -> None:
    ours = MultiHeadAttention(16, 2).eval()
    reference = nn.MultiheadAttention(16, 2, batch_first=True).eval()
    reference.load_state_dict(
        {
            "in_proj_weight": ours.in_proj.weight,
            "in_proj_bias": ours.in_proj.bias,
            "out_proj.weight": ours.out_proj.weight,
            "out_proj.bias": ours.out_proj.bias,
        }
    )
    x = torch.randn(2, 5, 16)
    future = ~causal_mask(5)[0, 0]  # torch: True = ignore
    expected, _ = reference(x, x, x, attn_mask=future, need_weights=False)
    for need_weights in (False, True):
        out, _ = ours(x, x, x, causal_mask(5), need_weights)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


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


@pytest.mark.parametrize("need_weights", [False, True])
def test_masked_keys_and_future_queries_change_nothing(need_weights: bool) -> None:
    attn = MultiHeadAttention(16, 2).eval()
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 4, 16)
    src_mask = padding_mask(torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]), 0)
    changed_memory = memory.clone()
    changed_memory[1, 2:] = torch.randn(2, 16) * 10  # padding keys and values
    before, _ = attn(x, memory, memory, src_mask, need_weights)
    after, _ = attn(x, changed_memory, changed_memory, src_mask, need_weights)
    torch.testing.assert_close(after, before)
    changed_x = x.clone()
    changed_x[:, 3:] = torch.randn(2, 2, 16)  # the last two positions
    before, _ = attn(x, x, x, causal_mask(5), need_weights)
    after, _ = attn(changed_x, changed_x, changed_x, causal_mask(5), need_weights)
    torch.testing.assert_close(after[:, :3], before[:, :3])
    assert not torch.allclose(after[:, 3:], before[:, 3:])


@pytest.mark.parametrize("layout", ["row-major", "step-major"])
@pytest.mark.parametrize("queries", [1, 5])
def test_scaled_dot_product_attention_equals_the_fused_kernel_on_cache_slices(
    queries: int, layout: str
) -> None:
    q = torch.randn(3, 2, queries, 8)
    if layout == "row-major":  # cache buffers (B, H, S_max, K)
        keys, values = torch.randn(3, 2, 10, 8), torch.randn(3, 2, 10, 8)
    else:  # (B, H, S_max, K) views of (S_max, B, H, K) buffers
        keys, values = (torch.randn(10, 3, 2, 8).permute(1, 2, 0, 3) for _ in range(2))
    k, v = keys[:, :, :6], values[:, :, :6]  # the filled steps: a strided view
    mask = torch.ones(3, 1, 1, 6, dtype=torch.bool)
    mask[1, ..., 4:] = False
    mask[2] = False  # nothing to attend to
    got, weights = scaled_dot_product_attention(q, k, v, mask)
    assert torch.all(got[2] == 0) and torch.all(weights[2] == 0)
    assert torch.all(weights[1, ..., 4:] == 0)
    torch.testing.assert_close(weights[:2].sum(-1), torch.ones(2, 2, queries))
    fused = F.scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(got, fused, atol=1e-6, rtol=1e-5)
    unmasked, _ = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(unmasked, F.scaled_dot_product_attention(q, k, v))


def test_projection_helpers_take_the_rows_of_in_proj() -> None:
    attn = MultiHeadAttention(16, 4)
    x = torch.randn(2, 3, 16)
    whole = attn.in_proj(x)  # (B, L, 3D): [q; k; v]
    torch.testing.assert_close(attn.project(x, 0, 3), whole)
    torch.testing.assert_close(attn.project(x, 1, 2), whole[..., 16:32])
    k, v = attn.project_kv(x)  # (B, H, L, K) each
    torch.testing.assert_close(attn.merge_heads(k), whole[..., 16:32])
    torch.testing.assert_close(attn.merge_heads(v), whole[..., 32:])
    heads = attn.split_heads(whole)  # (B, 3H, L, K)
    assert heads.shape == (2, 12, 3, 4)
    torch.testing.assert_close(attn.merge_heads(heads[:, 4:8]), whole[..., 16:32])


@pytest.mark.parametrize("need_weights", [False, True])
def test_a_growing_self_attention_cache_equals_causal_attention(need_weights: bool) -> None:
    attn = MultiHeadAttention(16, 2).eval()
    x = torch.randn(3, 6, 16)
    expected, expected_weights = attn(x, x, x, causal_mask(6), need_weights=True)
    cache = KVCache(rows=3, n_heads=2, head_dim=8, max_len=6)
    chunks = [x[:, :1], x[:, 1:4], x[:, 4:5], x[:, 5:]]  # one step, or several at once
    outputs, start = [], 0
    for chunk in chunks:
        steps = chunk.size(1)
        mask = causal_mask(start + steps)[..., start:, :]  # the new queries over all keys
        out, weights = attn(chunk, chunk, chunk, mask, need_weights, cache)
        if need_weights:
            assert weights is not None
            torch.testing.assert_close(
                weights, expected_weights[:, :, start : start + steps, : start + steps]
            )
        outputs.append(out)
        start += steps
    assert cache.length == 6
    torch.testing.assert_close(torch.cat(outputs, dim=1), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("need_weights", [False, True])
def test_rows_sharing_a_source_attend_to_its_keys_and_values_once(need_weights: bool) -> None:
    attn = MultiHeadAttention(16, 2).eval()
    memory = torch.randn(2, 5, 16)  # G = 2 sources
    src_mask = padding_mask(torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]), 0)
    query = torch.randn(6, 1, 16)  # W = 3 rows per source
    keys, values = attn.project_kv(memory)
    source = SourceKV(keys, values)
    grouped, weights = attn(query, query, query, src_mask, need_weights, source)
    rows = torch.tensor([0, 0, 0, 1, 1, 1])
    expected, expected_weights = attn(
        query, memory[rows], memory[rows], src_mask[rows], need_weights=True
    )
    torch.testing.assert_close(grouped, expected, atol=1e-5, rtol=1e-5)
    if need_weights:
        assert weights is not None and weights.shape == (6, 2, 1, 5)
        torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-5)
    else:
        assert weights is None


def test_attention_dropout_only_in_training() -> None:
    attn = MultiHeadAttention(16, 2, dropout=0.5)
    plain = MultiHeadAttention(16, 2, dropout=0.0)
    plain.load_state_dict(attn.state_dict())
    x = torch.randn(2, 4, 16)
    attn.eval()
    torch.testing.assert_close(attn(x, x, x)[0], plain(x, x, x)[0])
    attn.train()
    for need_weights in (False, True):
        assert not torch.allclose(attn(x, x, x, None, need_weights)[0], plain(x, x, x)[0])


def test_a_tiny_attention_layer_fits_a_batch() -> None:
    attn = MultiHeadAttention(16, 4)
    x, memory, target = torch.randn(4, 5, 16), torch.randn(4, 6, 16), torch.randn(4, 5, 16)
    mask = padding_mask(torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 2 + [0] * 4, [1] * 6]), 0)

    def loss() -> torch.Tensor:
        return F.mse_loss(attn(x, memory, memory, mask)[0], target)

    first, last = overfit(attn.parameters(), loss, steps=100)
    assert last < 0.1 * first, (first, last)


@pytest.mark.parametrize("batch", [2, 3])  # 3: B == T, where a (B, S) mask would broadcast
def test_rejects_a_mask_that_does_not_broadcast_to_batch_heads_queries_keys(batch: int) -> None:
    attn = MultiHeadAttention(16, 2)
    query, memory = torch.randn(batch, 3, 16), torch.randn(batch, 5, 16)
    wrong = [
        torch.ones(batch, 5, dtype=torch.bool),  # (B, S), as other libraries take it
        torch.ones(batch, 1, 1, 4, dtype=torch.bool),  # S off by one
        torch.ones(batch + 1, 1, 1, 5, dtype=torch.bool),  # another batch
    ]
    for mask in wrong:
        with pytest.raises(ValueError, match=r"mask must broadcast to \(B, H, T, S\)"):
            attn(query, memory, memory, mask)
    for mask in (torch.ones(batch, 1, 1, 5, dtype=torch.bool), torch.ones(1, 2, 3, 5).bool()):
        assert attn(query, memory, memory, mask)[0].shape == (batch, 3, 16)


def test_the_written_out_attention_checks_its_mask() -> None:
    q, k = torch.randn(2, 2, 3, 4), torch.randn(2, 2, 5, 4)  # (B, H, T, K), (B, H, S, K)
    with pytest.raises(TypeError, match="mask must be boolean"):
        scaled_dot_product_attention(q, k, k, torch.ones(2, 1, 1, 5))
    with pytest.raises(ValueError, match=r"mask must broadcast to \(B, H, T, S\) = \(2, 2, 3, 5\)"):
        scaled_dot_product_attention(q, k, k, torch.ones(2, 1, 1, 4, dtype=torch.bool))
    context, weights = scaled_dot_product_attention(q, k, k, torch.ones(2, 1, 3, 5).bool())
    assert context.shape == (2, 2, 3, 4) and weights.shape == (2, 2, 3, 5)
