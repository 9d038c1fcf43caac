"""Caches for incremental decoding.

Decoder self-attention keys/values live in a preallocated `KVCache` per layer that grows by one
step at a time, so the prefix is never recomputed. Cross-attention keys/values depend only on the
source, so they are computed once per source and kept in the `DecoderCache`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


class KVCache:
    """Preallocated keys and values of one self-attention layer.

    Args:
        rows: N, the number of sequences decoded together.
        n_heads, head_dim: H and K.
        max_len: the most steps that will be appended.
    """

    def __init__(
        self,
        rows: int,
        n_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | None = None,
    ) -> None:
        shape = (rows, n_heads, max_len, head_dim)
        self.keys = torch.empty(shape, dtype=dtype, device=device)  # (N, H, T_max, K)
        self.values = torch.empty(shape, dtype=dtype, device=device)  # (N, H, T_max, K)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.keys.size(2)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store new keys/values (N, H, t, K); return all cached so far (N, H, length, K)."""
        steps = k.size(2)
        if self.length + steps > self.capacity:
            raise RuntimeError(f"KV cache full: {self.length} + {steps} > {self.capacity} steps")
        end = self.length + steps
        self.keys[:, :, self.length : end] = k
        self.values[:, :, self.length : end] = v
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]  # (N, H, length, K)

    def select(self, rows: Tensor) -> None:
        """Keep and reorder rows: new row i = old row rows[i] (rows (N',) long)."""
        self.keys = self.keys[rows]  # (N', H, T_max, K)
        self.values = self.values[rows]  # (N', H, T_max, K)


@dataclass
class DecoderCache:
    """Everything a decoder needs between steps.

    Attributes:
        self_attn: one KVCache per decoder layer.
        cross_keys, cross_values: one (N, H, S, K) tensor per decoder layer.
        src_mask: (N, 1, 1, S) bool, True = real source token.
    """

    self_attn: list[KVCache]
    cross_keys: list[Tensor]
    cross_values: list[Tensor]
    src_mask: Tensor

    @property
    def length(self) -> int:
        """Number of target positions decoded so far."""
        return self.self_attn[0].length if self.self_attn else 0

    @property
    def rows(self) -> int:
        return self.src_mask.size(0)

    def select(self, rows: Tensor) -> None:
        """Keep and reorder rows (beam reordering, dropping finished sentences)."""
        for cache in self.self_attn:
            cache.select(rows)
        self.cross_keys = [k[rows] for k in self.cross_keys]  # (N', H, S, K)
        self.cross_values = [v[rows] for v in self.cross_values]  # (N', H, S, K)
        self.src_mask = self.src_mask[rows]  # (N', 1, 1, S)
