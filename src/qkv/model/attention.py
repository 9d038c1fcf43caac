"""Multi-head scaled dot-product attention: softmax(Q K^T / sqrt(K)) V, in H heads.

Two paths, one module: `short_attention` for training and scoring (the fused
`F.scaled_dot_product_attention`, or on a CPU for short sentences its unfused equal, which
`packed_attention` computes from and to packed rows with its own backward), and an
eager path of two batched matmuls that also returns the per-head softmax weights (for
pictures and tests) and serves incremental decoding, where a few queries per row attend to a
cache (`cached_attention`, the steps of `attend_cache` and `attend_source`). All compute the
same numbers (tested). Projections are packed: one (D -> 3D)
matmul for self-attention, one (D -> 2D) for the keys and values of cross-attention, both
slices of one `in_proj` weight, laid out like `torch.nn.MultiheadAttention`'s
`in_proj_weight` (rows: query, key, value).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.model.frozen_linear import FrozenLinear
from qkv.model.kv_cache import SelfAttentionCache
from qkv.model.linear import Linear, linear
from qkv.model.masks import check_mask
from qkv.model.packed_attention import (
    MASKED,
    packed_attention,
    packed_attention_applies,
    unfused_applies,
)
from qkv.model.packing import Packing


class MultiHeadAttention(nn.Module):
    """Multi-head attention whose queries and keys/values may have different lengths.

    Args:
        d_model: width D of inputs and output.
        n_heads: number of heads H; D must divide by H.
        dropout: dropout on the attention weights (training only).
        bias: whether the projections have biases.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if n_heads < 1:
            raise ValueError(f"n_heads must be at least 1, got {n_heads}")
        if d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.dropout = dropout
        self.in_proj = Linear(d_model, 3 * d_model, bias=bias)  # [q; k; v] rows
        self.out_proj = Linear(d_model, d_model, bias=bias)

    def _split_heads(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, L, K)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention projections in one matmul: x (B, L, D) -> q, k, v each (B, H, L, K)."""
        qkv = self.in_proj(x)  # (B, L, 3D)
        q, k, v = qkv.chunk(3, dim=-1)  # 3 x (B, L, D)
        return self._split_heads(q), self._split_heads(k), self._split_heads(v)

    def project_q(self, x: Tensor) -> Tensor:
        """Query projection only: x (B, T, D) -> (B, H, T, K)."""
        return self._split_heads(self._project(x, 0, 1))  # (B, H, T, K)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Key and value projections in one matmul: memory (B, S, D) -> k, v each (B, H, S, K)."""
        k, v = self._project(memory, 1, 3).chunk(2, dim=-1)  # 2 x (B, S, D)
        return self._split_heads(k), self._split_heads(v)

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        need_weights: bool = False,
        incremental: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attention over projected heads, then the output projection.

        Args:
            q: (B, H, T, K); k, v: (B, H, S, K).
            mask: bool, True = may attend, broadcastable to (B, H, T, S), or None.
            need_weights: also return the softmax weights (eager path).
            incremental: T is a few decoding steps and k, v are cached (eager path, faster
                there; see `eager_attention`).

        Returns:
            output (B, T, D) and weights (B, H, T, S) or None. Rows with nothing to attend
            to give zeros.
        """
        dropout_p = self.dropout if self.training else 0.0
        weights: Tensor | None = None
        if need_weights or incremental:
            context, all_weights = eager_attention(q, k, v, mask, dropout_p)  # (B, H, T, K)
            weights = all_weights if need_weights else None
        else:
            context = short_attention(q, k, v, mask, dropout_p)  # (B, H, T, K)
        batch, _, length, _ = context.shape
        merged = context.transpose(1, 2).reshape(batch, length, self.d_model)  # (B, T, D)
        return self.out_proj(merged), weights

    def attend_cache(self, x: Tensor, cache: SelfAttentionCache) -> Tensor:
        """Self-attention of one new position per row over its cache (incremental decoding).

        The position's keys and values are appended to `cache`, and it attends to everything
        cached; no mask, no weights, no checks (`DecoderLayer.step`).

        Args:
            x: (N, 1, D) the newest position of each row.

        Returns:
            (N, 1, D).
        """
        rows = x.size(0)
        qkv = self.in_proj(x).view(rows, 3, self.n_heads, 1, self.head_dim)  # (N, 3, H, 1, K)
        q, k, v = qkv.unbind(1)  # (N, H, 1, K) each
        keys, values = cache.append(k, v)  # (N, H, T, K) each
        return self.out_proj(cached_attention(q, keys, values).view(x.shape))  # (N, 1, D)

    def attend_source(
        self, x: Tensor, keys: Tensor, values: Tensor, bias: Tensor, guard: bool
    ) -> Tensor:
        """Cross-attention of one new position per row over its source's keys and values,
        computed once per source (incremental decoding, `DecoderCache`).

        The N rows form G groups of W consecutive rows that decode one source each (the W
        beams of a sentence): a group's rows attend as W query positions of that source.

        Args:
            x: (N, 1, D) the newest position of each row.
            keys, values: (G, H, S, K) each.
            bias: (G * H, 1, S) added to the scores: 0 at real source tokens, -inf at padding.
            guard: whether a source may have no real token at all (its rows then give zeros).

        Returns:
            (N, 1, D).
        """
        groups = keys.size(0)
        q = self.project_q(x.view(groups, -1, self.d_model))  # (G, H, W, K)
        context = cached_attention(q, keys, values, bias, guard)  # (G, H, W, K)
        return self.out_proj(context.transpose(1, 2).reshape(x.shape))  # (N, 1, D)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
        cache: SelfAttentionCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from `query` (B, T, D) to `key`/`value` (B, S, D).

        Self-attention (query is key is value) uses one packed projection; when `key is value`
        the keys and values share one. With a `cache`, the new keys/values are appended to it
        and the queries attend to everything cached so far (incremental decoding).

        Returns:
            output (B, T, D) and weights (B, H, T, S) when `need_weights`, else None.

        Raises:
            ValueError: if the inputs are not (B, ·, D) with one B, or key and value differ in
                length.
            TypeError: if `mask` is not boolean.
        """
        self._check_inputs(query, key, value)
        check_mask(mask)
        if query is key and key is value:
            q, k, v = self.project_qkv(query)  # (B, H, T, K) each
        else:
            q = self.project_q(query)  # (B, H, T, K)
            if key is value:
                k, v = self.project_kv(key)  # (B, H, S, K) each
            else:
                k = self._split_heads(self._project(key, 1, 2))  # (B, H, S, K)
                v = self._split_heads(self._project(value, 2, 3))  # (B, H, S, K)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, H, S_cached, K)
        return self.attend(q, k, v, mask, need_weights, incremental=cache is not None)

    def forward_packed(
        self,
        query: Tensor,
        memory: Tensor,
        mask: Tensor | None,
        query_rows: Packing,
        memory_rows: Packing,
    ) -> Tensor:
        """Attention in which only real tokens go through the projections.

        Equal, on the real query tokens, to `forward` on the padded batches; see `packing.py`.
        On a CPU, for short sentences, `packed_attention` goes from rows to rows with its
        backward written out; elsewhere the rows are unpacked for `short_attention`.

        Args:
            query: (M, D) the rows of a (B, T) batch, placed by `query_rows`.
            memory: (M', D) the rows of a (B, S) batch, placed by `memory_rows`; `query`
                itself for self-attention.
            mask: bool, True = may attend, broadcastable to (B, H, T, S), or None.

        Returns:
            (M, D) the output of each query row.
        """
        dropout_p = self.dropout if self.training else 0.0
        longest = max(query_rows.length, memory_rows.length)
        if packed_attention_applies(query, dropout_p, longest):
            if memory is query:
                queries, keys_values = self.in_proj(query), None  # (M, 3D)
            else:  # (M, D), (M', 2D)
                queries, keys_values = self._project(query, 0, 1), self._project(memory, 1, 3)
            context = packed_attention(
                queries, keys_values, mask, query_rows, memory_rows, self.n_heads
            )  # (M, D)
            return self.out_proj(context)  # (M, D)
        if memory is query:
            qkv = query_rows.unpack(self.in_proj(query))  # (B, T, 3D)
            q, k, v = (self._split_heads(x) for x in qkv.chunk(3, dim=-1))  # (B, H, T, K) each
        else:
            q = self._split_heads(query_rows.unpack(self._project(query, 0, 1)))  # (B, H, T, K)
            kv = memory_rows.unpack(self._project(memory, 1, 3))  # (B, S, 2D)
            k, v = (self._split_heads(x) for x in kv.chunk(2, dim=-1))  # (B, H, S, K) each
        context = short_attention(q, k, v, mask, dropout_p)  # (B, H, T, K)
        merged = context.transpose(1, 2).flatten(2)  # (B, T, D)
        return self.out_proj(query_rows.pack(merged))  # (M, D)

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        shapes = [tuple(x.shape) for x in (query, key, value)]
        if any(len(shape) != 3 or shape[2] != self.d_model for shape in shapes):
            raise ValueError(
                f"query, key and value must be (B, L, D) with D = d_model = {self.d_model}; "
                f"got {', '.join(map(str, shapes))}"
            )
        if len({shape[0] for shape in shapes}) > 1 or shapes[1] != shapes[2]:
            raise ValueError(
                "query, key and value must have one batch size, and key and value one length; "
                f"got {', '.join(map(str, shapes))}"
            )

    def _project(self, x: Tensor, first: int, last: int) -> Tensor:
        """x (..., D) through rows [first * D, last * D) of `in_proj` (0 q, 1 k, 2 v)."""
        if isinstance(self.in_proj, FrozenLinear) and first == 0:
            # Decoding's queries, at every step: that part of it, frozen too. The source's keys
            # and values are projected once per batch, where a reordered copy gains nothing.
            return self.in_proj.part(0, last * self.d_model)(x)
        rows = slice(first * self.d_model, last * self.d_model)
        bias = None if self.in_proj.bias is None else self.in_proj.bias[rows]
        return linear(x, self.in_proj.weight[rows], bias)  # (..., (last - first) * D)


def eager_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(K)) V written out as two batched matmuls, returning the weights too.

    It serves pictures and tests (the weights), and incremental decoding through `forward`
    with a cache (`cached_attention` is its twin for `DecoderLayer.step`): at one query per
    row (or the W beams of a sentence as W queries of their source, see `DecoderCache`) the
    fused kernel costs more than it saves, and `bmm` reads the cached keys and values in
    place, since a cache slice (B, H, S, K) of a (B, H, S_max, K) buffer merges its B and H
    without a copy.

    Args:
        q: (B, H, T, K); k, v: (B, H, S, K); mask: bool broadcastable to (B, H, T, S).

    Returns:
        context (B, H, T, K) and weights (B, H, T, S); fully masked rows get zero weights.
    """
    batch, heads, length, head_dim = q.shape
    n_keys = k.size(2)
    scores = torch.baddbmm(  # the scale applied inside the matmul, as its alpha
        q.new_zeros(()),
        q.reshape(batch * heads, length, head_dim),
        k.reshape(batch * heads, n_keys, head_dim).transpose(1, 2),
        beta=0.0,
        alpha=1.0 / math.sqrt(head_dim),
    ).view(batch, heads, length, n_keys)  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (B, H, T, S)
    if mask is not None:  # a row with every key masked is NaN: zeros instead
        weights = weights.nan_to_num(0.0)
    dropped = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    context = torch.bmm(
        dropped.reshape(batch * heads, length, n_keys), v.reshape(batch * heads, n_keys, head_dim)
    )  # (B * H, T, K)
    return context.view(batch, heads, length, head_dim), weights


def cached_attention(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None, guard: bool = False
) -> Tensor:
    """softmax(Q K^T / sqrt(K) + bias) V over cached keys and values: `eager_attention` for
    decoding steps, with the mask as a bias that the first matmul adds (no weights returned,
    no mask to invert and fill at every step).

    Finite scores are `eager_attention`'s to the bit: a 0 bias leaves a score as it is, and
    -inf masks it as `masked_fill` does.

    Args:
        q: (B, H, T, K); k, v: (B, H, S, K), e.g. cache slices, whose B and H merge without
            a copy.
        bias: (B * H, 1 or T, S) added to the scores, 0 or -inf, or None.
        guard: rows whose every key is masked give zeros (without it, NaN).

    Returns:
        context (B, H, T, K).
    """
    batch, heads, length, head_dim = q.shape
    n_keys = k.size(2)
    queries = q.reshape(batch * heads, length, head_dim)  # (B * H, T, K)
    keys = k.reshape(batch * heads, n_keys, head_dim).transpose(1, 2)  # (B * H, K, S)
    scale = 1.0 / math.sqrt(head_dim)
    if bias is None:  # the scale applied inside the matmul, as its alpha
        scores = torch.baddbmm(q.new_zeros(()), queries, keys, beta=0.0, alpha=scale)
    else:
        scores = torch.baddbmm(bias, queries, keys, alpha=scale)  # (B * H, T, S)
    weights = torch.softmax(scores, dim=-1)  # (B * H, T, S)
    if guard:
        weights = weights.nan_to_num(0.0)
    context = torch.bmm(weights, v.reshape(batch * heads, n_keys, head_dim))  # (B * H, T, K)
    return context.view(batch, heads, length, head_dim)


def short_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float = 0.0
) -> Tensor:
    """softmax(Q K^T / sqrt(K)) V, fused or not, whichever is faster for the shapes.

    On a CPU, in float32, for sentences up to `SHORT` tokens (`unfused_applies`), two
    `matmul`s and a softmax take half the time of `F.scaled_dot_product_attention`'s fused
    kernel, forward and backward (12.4 against 6.3 ms at 156 sentences of 23 tokens, 4
    heads of 64): that kernel is made for long sequences, and walks short ones one head at a
    time. Masked keys get -1e9 added rather than -inf, and a row with every key masked gives
    zeros, as the fused kernel's do: no NaN, forward or backward. Elsewhere, and for longer
    sequences, the fused kernel.

    Args:
        q: (B, H, T, K); k, v: (B, H, S, K); mask: bool, True = may attend, broadcastable to
            (B, H, T, S), or None.

    Returns:
        context (B, H, T, K).
    """
    if not unfused_applies(q, max(q.size(2), k.size(2))):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(1.0 / math.sqrt(q.size(-1)))  # (B, H, T, S)
    if mask is not None:
        masked = torch.zeros(mask.shape, dtype=q.dtype, device=q.device)  # (B, ·, T, S)
        scores = scores.add_(masked.masked_fill_(~mask, MASKED))
    weights = torch.softmax(scores, dim=-1)  # (B, H, T, S)
    if mask is not None:
        has_keys = mask.any(dim=-1, keepdim=True)  # (B, ·, T, 1)
        if not bool(has_keys.all()):  # rows with nothing to attend to: zeros, as fused
            weights = weights * has_keys
    if dropout_p > 0:
        weights = F.dropout(weights, dropout_p)
    return torch.matmul(weights, v)  # (B, H, T, K)


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(K)) V: q (B, H, T, K), k, v (B, H, S, K) -> context (B, H, T, K)
    and weights (B, H, T, S)."""
    return eager_attention(q, k, v, mask, dropout_p)
