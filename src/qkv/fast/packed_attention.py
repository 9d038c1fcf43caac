"""Attention from packed rows to packed rows for short CPU float32 sentences, without dropout.

The rows go into a grid (`qkv.fast.grid`) in one scatter and come back in one gather, with no
padded or head-major copy; each group is one batch of products; the backward is written out.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from qkv.fast.grid import Layout, derived, grouping, layout
from qkv.fast.packing import Packing

SHORT = 128  # up to this many queries and keys, unfused products are faster on a CPU
MASKED = -1e9  # added to the scores of masked keys: exp() of it is 0 beside any real score


def packed_attention_applies(queries: Tensor, dropout_p: float, longest: int) -> bool:
    """Whether `packed_attention` serves these rows; `longest`: max(T, S)."""
    return (
        dropout_p == 0.0
        and queries.device.type == "cpu"
        and queries.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
        and longest <= SHORT
    )


def packed_attention(
    queries: Tensor,
    keys_values: Tensor | None,
    mask: Tensor | None,
    query_rows: Packing,
    memory_rows: Packing,
    heads: int,
) -> Tensor:
    """softmax(Q K^T / sqrt(K)) V from and to packed rows -> (M'_q, D), zeros in rows with no
    key. `queries`: [q; k; v] (M'_q, 3D), or with `keys_values` [k; v] (M'_k, 2D), q (M'_q, D).
    `mask` (True = may attend, broadcastable to (B, H, T, S)) must leave out padding keys."""
    groups = grouping(query_rows)
    query_layout = layout(query_rows, groups)
    key_layout = query_layout if keys_values is None else layout(memory_rows, groups)
    masks = _group_masks(mask, query_layout, key_layout, heads, queries.dtype)
    training = torch.is_grad_enabled()  # a backward may follow (off inside `apply`)
    out: Tensor = _PackedAttention.apply(
        queries, keys_values, masks, query_layout, key_layout, heads, training
    )
    return out


GroupMasks = list[tuple[Tensor, Tensor | None]]


def _group_masks(
    mask: Tensor | None,
    query_layout: Layout,
    key_layout: Layout,
    heads: int,
    dtype: torch.dtype,
) -> GroupMasks:
    """Every group's `_group_mask`, made once for all the layers."""

    def make() -> GroupMasks:
        return [
            _group_mask(mask, sentences, heads, length, source_length, dtype)
            for sentences, length, source_length in zip(
                query_layout.sentences, query_layout.lengths, key_layout.lengths, strict=True
            )
        ]

    return derived(query_layout.derived, make, "masks", mask, key_layout, heads, dtype)


def _group_mask(
    mask: Tensor | None,
    sentences: Tensor,
    heads: int,
    length: int,
    source_length: int,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor | None]:
    """One group's additive mask (H · B_g, T_g, S_g), heads before sentences, and, where
    some query may attend to nothing, which ones may attend to something (H · B_g, T_g, 1)."""
    batch = len(sentences)
    bias = torch.zeros(heads, batch, length, source_length, dtype=dtype, device=sentences.device)
    if mask is None:
        return bias.view(heads * batch, length, source_length), None
    picked = mask[..., :length, :source_length]
    if picked.size(0) > 1:
        picked = picked.index_select(0, sentences)
    allowed = picked.expand(batch, heads, length, source_length).transpose(0, 1)  # (H, B_g, ·)
    bias.masked_fill_(~allowed, MASKED)
    has_keys = None
    if not bool(picked.any(dim=-1).all()):  # rows with nothing to attend to
        has_keys = allowed.any(dim=-1, keepdim=True)  # (H, B_g, T_g, 1)
        has_keys = has_keys.reshape(heads * batch, length, 1).to(dtype)  # (H · B_g, T_g, 1)
    return bias.view(heads * batch, length, source_length), has_keys


class _PackedAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        queries: Tensor,
        keys_values: Tensor | None,
        masks: GroupMasks,
        query_layout: Layout,
        key_layout: Layout,
        heads: int,
        training: bool,
    ) -> Tensor:
        if keys_values is None:
            grids = [_to_grid(queries, query_layout, 3 * heads)]  # [q; k; v]
        else:
            grids = [
                _to_grid(queries, query_layout, heads),
                _to_grid(keys_values, key_layout, 2 * heads),  # [k; v]
            ]
        head_dim = grids[0].size(1)
        scale = 1.0 / math.sqrt(head_dim)
        context = queries.new_empty(heads * query_layout.total, head_dim)  # every slot written
        weights = []
        for g, (bias, has_keys) in enumerate(masks):
            q, k, v = _group(grids, query_layout, key_layout, g, heads)  # (H · B_g, ·, K)
            scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=scale)  # (HB_g, T_g, S_g)
            weights_g = torch.softmax(scores, dim=-1)  # (HB_g, T_g, S_g)
            if has_keys is not None:
                weights_g.mul_(has_keys)  # zeros, and zero gradients, where no key may be attended
            torch.bmm(weights_g, v, out=query_layout.block(context, g, 1, heads)[0])
            weights.append(weights_g)
        ctx.save_for_backward(*grids, *weights)
        ctx.layout = (query_layout, key_layout, heads, scale, len(grids))
        ctx.rows = (len(queries), 0 if keys_values is None else len(keys_values))
        return _from_grid(context, query_layout, len(queries), heads)  # (M'_q, D)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        query_layout, key_layout, heads, scale, n_grids = ctx.layout
        query_count, memory_count = ctx.rows
        grids, weights = ctx.saved_tensors[:n_grids], ctx.saved_tensors[n_grids:]
        grad_context = _to_grid(grad, query_layout, heads)
        grads = [torch.empty_like(grid) for grid in grids]  # every slot written below
        for g, weights_g in enumerate(weights):  # (H · B_g, T_g, S_g)
            q, k, v = _group(grids, query_layout, key_layout, g, heads)
            grad_q, grad_k, grad_v = _group(grads, query_layout, key_layout, g, heads)
            grad_context_g = query_layout.block(grad_context, g, 1, heads)[0]  # (HB_g, T_g, K)
            torch.bmm(weights_g.transpose(1, 2), grad_context_g, out=grad_v)  # (HB_g, S_g, K)
            grad_weights = torch.bmm(grad_context_g, v.transpose(1, 2))  # (HB_g, T_g, S_g)
            grad_scores = _softmax_grad(grad_weights, weights_g, scale)  # (HB_g, T_g, S_g)
            torch.bmm(grad_scores, k, out=grad_q)  # (HB_g, T_g, K)
            torch.bmm(grad_scores.transpose(1, 2), q, out=grad_k)  # (HB_g, S_g, K)
        grad_in: tuple[Tensor | None, ...]
        if n_grids == 1:
            grad_in = _from_grid(grads[0], query_layout, query_count, 3 * heads), None
        else:
            grad_in = (
                _from_grid(grads[0], query_layout, query_count, heads),
                _from_grid(grads[1], key_layout, memory_count, 2 * heads),
            )
        return *grad_in, None, None, None, None, None


def _group(
    grids: list[Tensor] | tuple[Tensor, ...],
    query_layout: Layout,
    key_layout: Layout,
    group: int,
    heads: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """q (H · B_g, T_g, K), k and v (H · B_g, S_g, K): views of one group's block."""
    if len(grids) == 1:
        q, k, v = query_layout.block(grids[0], group, 3, heads).unbind(0)
        return q, k, v
    k, v = key_layout.block(grids[1], group, 2, heads).unbind(0)
    return query_layout.block(grids[0], group, 1, heads)[0], k, v


def _to_grid(rows: Tensor, layout: Layout, parts: int) -> Tensor:
    """rows (M', parts · K) -> grid (parts · total, K), zeros at the padding."""
    count = len(layout.local)
    head_dim = rows.size(1) // parts
    grid = rows.new_zeros(parts * layout.total, head_dim)
    grid.index_copy_(0, layout.index(parts), rows[:count].reshape(count * parts, head_dim))
    return grid


def _from_grid(grid: Tensor, layout: Layout, n_rows: int, parts: int) -> Tensor:
    """grid (parts · total, K) -> rows (n_rows, parts · K), zeros in the filler rows."""
    count = len(layout.local)
    out = grid.new_empty(n_rows, parts * grid.size(1))  # (M', parts · K)
    torch.index_select(grid, 0, layout.index(parts), out=out[:count].view(-1, grid.size(1)))
    out[count:] = 0.0
    return out


def _softmax_grad(grad: Tensor, weights: Tensor, scale: float) -> Tensor:
    """softmax's input gradient times scale: scale · weights ⊙ (grad − Σ_s grad ⊙ weights)."""
    return weights * (grad - (grad * weights).sum(-1, keepdim=True)) * scale
