"""Attention from packed rows to packed rows, its backward written out, for short sentences.

`MultiHeadAttention.forward_packed` keeps a batch as its real tokens, (M, D) rows, and
attention alone needs the padded (B, H, L, K) layout. Through autograd, that costs a scatter
into (B, L, 3D), a copy of each of q, k and v into head-major order, a copy of the context
back, a gather of the rows, and the mirror of each in the backward, with a concatenation of
the three gradients. Here the rows go into head-major order in one scatter, and come back in
one gather and one copy, forward and backward; the scale and the mask are
applied inside the first product (`baddbmm`); the backward is the softmax's and four batched
products, whose results are written straight into the gradient's head-major buffer.

It serves CPU float32 sentences of up to `SHORT` tokens without attention dropout, where the
unfused products are the faster ones (see `short_attention`); elsewhere `forward_packed`
keeps autograd's path. The numbers are those of that path (tested, forward and backward).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from qkv.model.packing import Packing

# Up to this many queries and keys, the unfused product is the faster one on a CPU.
SHORT = 128
MASKED = -1e9  # added to the scores of masked keys: exp() of it is 0 beside any real score


def unfused_applies(x: Tensor, longest: int) -> bool:
    """Whether two products and a softmax beat the fused kernel for x's attention: CPU,
    float32, no autocast, at most `SHORT` queries and keys (`longest`: max(T, S))."""
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
        and longest <= SHORT
    )


def packed_attention_applies(queries: Tensor, dropout_p: float, longest: int) -> bool:
    """Whether `packed_attention` serves these rows: `unfused_applies`, without dropout."""
    return dropout_p == 0.0 and unfused_applies(queries, longest)


def packed_attention(
    queries: Tensor,
    keys_values: Tensor | None,
    mask: Tensor | None,
    query_rows: Packing,
    memory_rows: Packing,
    heads: int,
) -> Tensor:
    """softmax(Q K^T / sqrt(K)) V in `heads` heads, from and to packed rows.

    Args:
        queries: (M'_q, 3D), the packed [q; k; v] projections of self-attention when
            `keys_values` is None; else (M'_q, D), the queries alone.
        keys_values: (M'_k, 2D), the packed [k; v] projections of cross-attention, or None.
        mask: bool, True = may attend, broadcastable to (B, H, T, S), or None.
        query_rows, memory_rows: where the rows sit in their (B, T) and (B, S) batches (the
            same for self-attention).

    Returns:
        (M'_q, D), the context of each query row before the output projection; zeros in the
        filler rows, and in rows with nothing to attend to.
    """
    batch, length, source_length = query_rows.batch, query_rows.length, memory_rows.length
    # Heads before sentences, as `_to_heads` lays them out.
    bias = queries.new_zeros(heads, batch, length, source_length)  # (H, B, T, S)
    has_keys = None
    if mask is not None:
        allowed = mask.expand(batch, heads, length, source_length).transpose(0, 1)  # (H, B, T, S)
        bias.masked_fill_(~allowed, MASKED)
        if not bool(mask.any(dim=-1).all()):  # rows with nothing to attend to
            has_keys = allowed.any(dim=-1, keepdim=True)  # (H, B, T, 1)
            has_keys = has_keys.reshape(heads * batch, length, 1).to(queries.dtype)  # (HB, T, 1)
    out: Tensor = _PackedAttention.apply(
        queries,
        keys_values,
        bias.view(heads * batch, length, source_length),
        has_keys,
        query_rows,
        memory_rows,
        heads,
    )
    return out


class _PackedAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        queries: Tensor,
        keys_values: Tensor | None,
        bias: Tensor,
        has_keys: Tensor | None,
        query_rows: Packing,
        memory_rows: Packing,
        heads: int,
    ) -> Tensor:
        if keys_values is None:
            q, k, v = _to_heads(queries, query_rows, 3, heads).unbind(0)  # (HB, T, K) each
        else:
            q = _to_heads(queries, query_rows, 1, heads)[0]  # (HB, T, K)
            k, v = _to_heads(keys_values, memory_rows, 2, heads).unbind(0)  # (HB, S, K) each
        scale = 1.0 / math.sqrt(q.size(-1))
        scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=scale)  # (HB, T, S)
        weights = torch.softmax(scores, dim=-1)  # (HB, T, S)
        if has_keys is not None:
            weights.mul_(has_keys)  # zeros, and zero gradients, where no key may be attended
        context = torch.bmm(weights, v)  # (HB, T, K)
        ctx.save_for_backward(q, k, v, weights)
        ctx.layout = (query_rows, memory_rows, heads, scale, keys_values is None)
        return _from_heads(context[None], query_rows, heads)  # (M'_q, D)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, weights = ctx.saved_tensors  # (HB, T, K), (HB, S, K) x 2, (HB, T, S)
        query_rows, memory_rows, heads, scale, self_attention = ctx.layout
        grad_context = _to_heads(grad, query_rows, 1, heads)[0]  # (HB, T, K)
        if self_attention:  # one buffer for q, k and v: one gather back to rows
            grads = q.new_empty(3, *q.shape)  # (3, HB, T, K)
            grad_q, grad_k, grad_v = grads.unbind(0)
        else:
            q_grads, kv_grads = q.new_empty(1, *q.shape), k.new_empty(2, *k.shape)
            grad_q, (grad_k, grad_v) = q_grads[0], kv_grads.unbind(0)
        torch.bmm(weights.transpose(1, 2), grad_context, out=grad_v)  # (HB, S, K)
        grad_weights = torch.bmm(grad_context, v.transpose(1, 2))  # (HB, T, S)
        grad_scores = torch._softmax_backward_data(grad_weights, weights, -1, weights.dtype)
        grad_scores.mul_(scale)  # (HB, T, S)
        torch.bmm(grad_scores, k, out=grad_q)  # (HB, T, K)
        torch.bmm(grad_scores.transpose(1, 2), q, out=grad_k)  # (HB, S, K)
        if self_attention:
            return _from_heads(grads, query_rows, heads), None, None, None, None, None, None
        return (
            _from_heads(q_grads, query_rows, heads),
            _from_heads(kv_grads, memory_rows, heads),
            None,
            None,
            None,
            None,
            None,
        )


def _to_heads(rows: Tensor, packing: Packing, parts: int, heads: int) -> Tensor:
    """rows (M', P * H * K) -> (P, H * B, L, K), each head's real rows in place in its (B, L)
    grid, zeros at the padding (P: how many projections, q, k, v, side by side in a row).

    One scatter along the grid's positions; heads before sentences, so that no permutation
    is copied (the products do not mind the order of their batch).
    """
    batch, length, count = packing.batch, packing.length, packing.count
    head_dim = rows.size(1) // (parts * heads)
    grid = rows.new_zeros(parts * heads, batch * length, head_dim)  # (P * H, B * L, K)
    real = rows[:count].view(count, parts * heads, head_dim).transpose(0, 1)  # (P * H, M, K)
    grid.index_copy_(1, packing.index[:count], real)
    return grid.view(parts, heads * batch, length, head_dim)


def _from_heads(x: Tensor, packing: Packing, heads: int) -> Tensor:
    """x (P, H * B, L, K) -> rows (M', P * H * K), the inverse of `_to_heads`; zeros in the
    filler rows."""
    parts, _, length, head_dim = x.shape
    count = packing.count
    grid = x.reshape(parts * heads, packing.batch * length, head_dim)  # (P * H, B * L, K)
    picked = grid.index_select(1, packing.index[:count])  # (P * H, M, K)
    out = x.new_empty(len(packing.index), parts * heads * head_dim)  # (M', P * H * K)
    out[:count].view(count, parts * heads, head_dim).copy_(picked.transpose(0, 1))
    out[count:] = 0.0
    return out
