"""Attention from packed rows to packed rows for short CPU float32 sentences, without dropout.

The rows go into a grid (`qkv.fast.grid`) in one scatter and come back in one gather, with no
padded or head-major copy; each group is one batch of products; the backward is written out.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from qkv.fast.grid import Layout, grouping, layout, per_batch
from qkv.fast.packing import Packing

SHORT = 128  # up to this many queries and keys, unfused products are faster on a CPU
MASKED = -1e9  # added to the scores of masked keys: exp() of it is 0 beside any real score

GroupMasks = list[tuple[Tensor, Tensor | None]]
Side = tuple[Layout, int]  # a grid's layout and its parts: [q; k; v] 3, or q 1 and [k; v] 2


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
    sides: list[Side] = [(query_layout, 3)]
    if keys_values is not None:
        sides = [(query_layout, 1), (layout(memory_rows, groups), 2)]
    masks = _group_masks(query_layout, mask, sides[-1][0], heads, queries.dtype)
    return _PackedAttention.apply(queries, keys_values, masks, sides, heads)


@per_batch
def _group_masks(
    query_layout: Layout, mask: Tensor | None, key_layout: Layout, heads: int, dtype: torch.dtype
) -> GroupMasks:
    """Each group's additive mask (H · B_g, T_g, S_g), heads before sentences, and, where some
    query may attend to nothing, which ones may attend to something (H · B_g, T_g, 1); made
    once for all the layers."""
    masks: GroupMasks = []
    groups = zip(query_layout.sentences, query_layout.lengths, key_layout.lengths, strict=True)
    for sentences, length, source_length in groups:
        batch = len(sentences)
        bias = sentences.new_zeros((heads, batch, length, source_length), dtype=dtype)
        has_keys = None
        if mask is not None:
            picked = mask[..., :length, :source_length]
            if picked.size(0) > 1:
                picked = picked.index_select(0, sentences)
            allowed = picked.expand(batch, heads, length, source_length).transpose(0, 1)
            bias.masked_fill_(~allowed, MASKED)  # (H, B_g, T_g, S_g)
            if not bool(picked.any(dim=-1).all()):  # rows with nothing to attend to
                has_keys = allowed.any(dim=-1, keepdim=True)  # (H, B_g, T_g, 1)
                has_keys = has_keys.reshape(heads * batch, length, 1).to(dtype)
        masks.append((bias.view(heads * batch, length, source_length), has_keys))
    return masks


class _PackedAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        queries: Tensor,
        keys_values: Tensor | None,
        masks: GroupMasks,
        sides: list[Side],
        heads: int,
    ) -> Tensor:
        inputs = [x for x in (queries, keys_values) if x is not None]
        grids = [
            _to_grid(x, side[0], side[1] * heads) for x, side in zip(inputs, sides, strict=True)
        ]
        query_layout, head_dim = sides[0][0], grids[0].size(1)
        scale = 1.0 / math.sqrt(head_dim)
        context = queries.new_empty(heads * query_layout.total, head_dim)  # every slot written
        weights = []
        for g, (bias, has_keys) in enumerate(masks):
            q, k, v = _group(grids, sides, g, heads)  # (H · B_g, ·, K)
            scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=scale)  # (HB_g, T_g, S_g)
            weights_g = torch.softmax(scores, dim=-1)  # (HB_g, T_g, S_g)
            if has_keys is not None:
                weights_g.mul_(has_keys)  # zeros, and zero gradients, where no key may be attended
            torch.bmm(weights_g, v, out=query_layout.block(context, g, 1, heads)[0])
            weights.append(weights_g)
        ctx.save_for_backward(*grids, *weights)
        ctx.sides, ctx.heads, ctx.scale = sides, heads, scale
        ctx.rows = [len(x) for x in inputs]
        return _from_grid(context, query_layout, len(queries), heads)  # (M'_q, D)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        sides, heads = ctx.sides, ctx.heads
        grids, weights = ctx.saved_tensors[: len(sides)], ctx.saved_tensors[len(sides) :]
        query_layout = sides[0][0]
        grad_context = _to_grid(grad, query_layout, heads)
        grads = [torch.empty_like(grid) for grid in grids]  # every slot written below
        for g, weights_g in enumerate(weights):  # (H · B_g, T_g, S_g)
            q, k, v = _group(grids, sides, g, heads)
            grad_q, grad_k, grad_v = _group(grads, sides, g, heads)
            grad_context_g = query_layout.block(grad_context, g, 1, heads)[0]  # (HB_g, T_g, K)
            torch.bmm(weights_g.transpose(1, 2), grad_context_g, out=grad_v)  # (HB_g, S_g, K)
            grad_weights = torch.bmm(grad_context_g, v.transpose(1, 2))  # (HB_g, T_g, S_g)
            grad_scores = _softmax_grad(grad_weights, weights_g, ctx.scale)  # (HB_g, T_g, S_g)
            torch.bmm(grad_scores, k, out=grad_q)  # (HB_g, T_g, K)
            torch.bmm(grad_scores.transpose(1, 2), q, out=grad_k)  # (HB_g, S_g, K)
        grad_in = [
            _from_grid(grad_grid, layout, rows, parts * heads)
            for grad_grid, (layout, parts), rows in zip(grads, sides, ctx.rows, strict=True)
        ]
        return *grad_in, *[None] * (5 - len(grad_in))  # None for keys_values in self-attention


def _group(
    grids: list[Tensor] | tuple[Tensor, ...], sides: list[Side], group: int, heads: int
) -> tuple[Tensor, Tensor, Tensor]:
    """q (H · B_g, T_g, K), k and v (H · B_g, S_g, K): views of one group's blocks."""
    q, k, v = (
        part
        for grid, (layout, parts) in zip(grids, sides, strict=True)
        for part in layout.block(grid, group, parts, heads).unbind(0)
    )
    return q, k, v


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
