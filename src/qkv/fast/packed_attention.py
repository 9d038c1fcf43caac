"""Attention from packed rows to packed rows for short CPU float32 sentences, without dropout.

The rows are scattered straight into a head-major grid of the padded batch, (parts · H · B · L,
K): one copy where the reference unpacks and then transposes the heads, and one gather back.
The products are batched over heads and sentences; the backward is written out.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from qkv.fast.packing import Packing, per_batch

SHORT = 128  # up to this many queries and keys, unfused products are faster on a CPU
MASKED = -1e9  # added to the scores of masked keys: exp() of it is 0 beside any real score

Side = tuple[Packing, int]  # a side's rows and its parts: [q; k; v] 3, or q 1 and [k; v] 2


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
    sides: list[Side] = [(query_rows, 3)]
    if keys_values is not None:
        sides = [(query_rows, 1), (memory_rows, 2)]
    bias, has_keys = _additive_mask(query_rows, mask, sides[-1][0], heads, queries.dtype)
    return _PackedAttention.apply(queries, keys_values, bias, has_keys, sides, heads)


@per_batch
def _additive_mask(
    query_rows: Packing, mask: Tensor | None, key_rows: Packing, heads: int, dtype: torch.dtype
) -> tuple[Tensor, Tensor | None]:
    """The additive mask (H · B, T, S), heads before sentences, and, where some query may
    attend to nothing, which ones may attend to something (H · B, T, 1); made once for all
    the layers."""
    shape = (heads, query_rows.batch, query_rows.length, key_rows.length)  # (H, B, T, S)
    bias = torch.zeros(shape, dtype=dtype, device=query_rows.index.device)
    has_keys = None
    if mask is not None:
        allowed = mask.expand(shape[1], heads, *shape[2:]).transpose(0, 1)  # (H, B, T, S)
        bias.masked_fill_(~allowed, MASKED)
        if not bool(mask.any(dim=-1).all()):  # rows with nothing to attend to
            has_keys = allowed.any(dim=-1, keepdim=True).flatten(0, 1).to(dtype)  # (HB, T, 1)
    return bias.flatten(0, 1), has_keys


class _PackedAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        queries: Tensor,
        keys_values: Tensor | None,
        bias: Tensor,
        has_keys: Tensor | None,
        sides: list[Side],
        heads: int,
    ) -> Tensor:
        inputs = [x for x in (queries, keys_values) if x is not None]
        grids = [
            _to_grid(x, rows, parts * heads) for x, (rows, parts) in zip(inputs, sides, strict=True)
        ]
        q, k, v = _split(grids, sides, heads)  # (H · B, T, K), (H · B, S, K) twice
        scale = 1.0 / math.sqrt(q.size(-1))
        scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=scale)  # (HB, T, S)
        weights = torch.softmax(scores, dim=-1)  # (HB, T, S)
        if has_keys is not None:
            weights.mul_(has_keys)  # zeros, and zero gradients, where no key may be attended
        context = torch.bmm(weights, v)  # (HB, T, K)
        ctx.save_for_backward(*grids, weights)
        ctx.sides, ctx.heads, ctx.scale = sides, heads, scale
        ctx.rows = [len(x) for x in inputs]
        query_rows = sides[0][0]
        return _from_grid(context.flatten(0, 1), query_rows, len(queries), heads)  # (M'_q, D)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        sides, heads = ctx.sides, ctx.heads
        *grids, weights = ctx.saved_tensors  # weights (HB, T, S)
        q, k, v = _split(grids, sides, heads)
        grads = [torch.empty_like(grid) for grid in grids]  # every slot written below
        grad_q, grad_k, grad_v = _split(grads, sides, heads)
        grad_context = _to_grid(grad, sides[0][0], heads).view_as(q)  # (HB, T, K)
        torch.bmm(weights.transpose(1, 2), grad_context, out=grad_v)  # (HB, S, K)
        grad_weights = torch.bmm(grad_context, v.transpose(1, 2))  # (HB, T, S)
        grad_scores = _softmax_grad(grad_weights, weights, ctx.scale)  # (HB, T, S)
        torch.bmm(grad_scores, k, out=grad_q)  # (HB, T, K)
        torch.bmm(grad_scores.transpose(1, 2), q, out=grad_k)  # (HB, S, K)
        grad_in = [
            _from_grid(grad_grid, rows, count, parts * heads)
            for grad_grid, (rows, parts), count in zip(grads, sides, ctx.rows, strict=True)
        ]
        return *grad_in, *[None] * (6 - len(grad_in))  # None for keys_values in self-attention


def _split(grids: list[Tensor], sides: list[Side], heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """q (H · B, T, K), k and v (H · B, S, K): views of the grids."""
    q, k, v = (
        part
        for grid, (rows, parts) in zip(grids, sides, strict=True)
        for part in grid.view(parts, heads * rows.batch, rows.length, grid.size(1)).unbind(0)
    )
    return q, k, v


@per_batch
def _grid_index(rows: Packing, parts: int) -> Tensor:
    """(M · parts,) long: the grid row of each real row's head-parts, in the order of a
    (M, parts, K) view of the rows: part j of the token at flat position i is row j · B · L + i."""
    offsets = torch.arange(parts, device=rows.index.device) * (rows.batch * rows.length)
    return (rows.index[: rows.count, None] + offsets).view(-1)


def _to_grid(x: Tensor, rows: Packing, parts: int) -> Tensor:
    """x (M', parts · K) -> grid (parts · B · L, K), zeros at the padding."""
    head_dim = x.size(1) // parts
    grid = x.new_zeros(parts * rows.batch * rows.length, head_dim)
    grid.index_copy_(0, _grid_index(rows, parts), x[: rows.count].reshape(-1, head_dim))
    return grid


def _from_grid(grid: Tensor, rows: Packing, n_rows: int, parts: int) -> Tensor:
    """grid (parts · B · L, K) -> rows (n_rows, parts · K), zeros in the filler rows."""
    out = grid.new_empty(n_rows, parts * grid.size(1))  # (M', parts · K)
    real = out[: rows.count].view(-1, grid.size(1))
    torch.index_select(grid, 0, _grid_index(rows, parts), out=real)
    out[rows.count :] = 0.0
    return out


def _softmax_grad(grad: Tensor, weights: Tensor, scale: float) -> Tensor:
    """softmax's input gradient times scale: scale · weights ⊙ (grad − Σ_s grad ⊙ weights)."""
    return weights * (grad - (grad * weights).sum(-1, keepdim=True)) * scale
