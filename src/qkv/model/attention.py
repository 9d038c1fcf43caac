"""Scaled dot-product attention and multi-head attention (section 3.2 of the paper).

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

`MultiHeadAttention` runs the fused `F.scaled_dot_product_attention`, or, when the weights are
asked for, `scaled_dot_product_attention` below, which gives the same numbers and the weights.
The projections share one `in_proj` (rows: query, key, value), laid out like the `in_proj_weight`
of `torch.nn.MultiheadAttention`, so self-attention projects q, k and v in one matmul.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.model.kv_cache import SelfAttentionCache, SourceKV
from qkv.model.masks import check_mask


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(K)) V, returning the weights too.

    Args:
        q: (B, H, T, K); k, v: (B, H, S, K).
        mask: bool, True = may attend, broadcastable to (B, H, T, S), or None.
        dropout_p: dropout on the weights.

    Returns:
        context (B, H, T, K) and weights (B, H, T, S); a row with every key masked gets zero
        weights (and a zero context), as the fused kernel gives.
    """
    check_mask(mask, shape=(*q.shape[:3], k.size(-2)))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # (B, H, T, S)
    return F.dropout(weights, dropout_p) @ v, weights  # (B, H, T, K), (B, H, T, S)


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
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)  # [q; k; v] rows
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
        cache: SelfAttentionCache | SourceKV | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from `query` (B, T, D) to `key`/`value` (B, S, D).

        With a self-attention cache (decoding), the new keys and values are appended to it and
        the queries attend to everything cached. With a `SourceKV` (cross-attention while
        decoding), `key`/`value` are not read: the rows of one source (its W beams; G sources)
        attend as W queries to that source's precomputed keys and values.

        Returns:
            output (B, T, D) and weights (B, H, T, S) when `need_weights`, else None.

        Raises:
            ValueError: if the inputs are not (B, ·, D) with one B, key and value differ in
                length, or (without a cache) `mask` does not broadcast to (B, H, T, S).
            TypeError: if `mask` is not boolean.
        """
        check_mask(mask)
        if isinstance(cache, SourceKV):
            grouped = query.reshape(cache.keys.size(0), -1, self.d_model)  # (G, W * T, D)
            q = self.split_heads(self.project(grouped, 0, 1))  # (G, H, W * T, K)
            output, weights = self.attend_heads(q, cache.keys, cache.values, mask, need_weights)
            if weights is not None:  # (G, H, W * T, S) -> (B, H, T, S)
                weights = weights.transpose(1, 2).reshape(*query.shape[:2], self.n_heads, -1)
                weights = weights.transpose(1, 2)
            return output.reshape(query.shape), weights  # (B, T, D)
        self._check_inputs(query, key, value, None if cache is not None else mask)
        if query is key and key is value:  # self-attention: one matmul
            q, k, v = self.split_heads(self.project(query, 0, 3)).chunk(3, dim=1)
        else:
            q = self.split_heads(self.project(query, 0, 1))  # (B, H, T, K)
            k, v = self.project_kv(key) if key is value else self._kv_apart(key, value)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, H, S_cached, K) each
        return self.attend_heads(q, k, v, mask, need_weights)

    def attend_heads(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Projected heads q (B, H, T, K), k, v (B, H, S, K) -> output (B, T, D), weights."""
        dropout_p = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            context, weights = scaled_dot_product_attention(q, k, v, mask, dropout_p)
        else:
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        return self.out_proj(self.merge_heads(context)), weights  # (B, T, D)

    def project(self, x: Tensor, first: int, last: int) -> Tensor:
        """x (..., D) through rows [first * D, last * D) of `in_proj` (0 q, 1 k, 2 v)."""
        if (first, last) == (0, 3):
            return self.in_proj(x)  # (..., 3D)
        rows = slice(first * self.d_model, last * self.d_model)
        bias = None if self.in_proj.bias is None else self.in_proj.bias[rows]
        return F.linear(x, self.in_proj.weight[rows], bias)  # (..., (last - first) * D)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values in one matmul: memory (B, S, D) -> k, v each (B, H, S, K)."""
        k, v = self.split_heads(self.project(memory, 1, 3)).chunk(2, dim=1)  # (B, H, S, K)
        return k, v

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, L, n * D) -> (B, n * H, L, K): n parts (q, k, v) of H heads each."""
        batch, length, width = x.shape
        heads = width // self.head_dim
        return x.view(batch, length, heads, self.head_dim).transpose(1, 2)  # (B, n*H, L, K)

    def merge_heads(self, x: Tensor) -> Tensor:
        """(B, H, L, K) -> (B, L, D)."""
        return x.transpose(1, 2).flatten(2)  # (B, L, D)

    def _kv_apart(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        k = self.split_heads(self.project(key, 1, 2))  # (B, H, S, K)
        return k, self.split_heads(self.project(value, 2, 3))  # (B, H, S, K)

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None) -> None:
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
        check_mask(mask, shape=(shapes[0][0], self.n_heads, shapes[0][1], shapes[1][1]))
