"""Packing the real tokens of a padded batch, so that position-wise work skips the padding.

In a batch of sentences of mixed lengths, padding is often a third or more of the positions.
Every position-wise operation (projections, feed-forward network, layer norms, dropout,
residual additions) treats each position alone, so it can run on the M real tokens only, held
as (M, D) rows. Attention alone needs the padded (B, L, ...) layout; `unpack` puts the rows
back in place for it and `pack` takes them out again.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class Packing:
    """Where the real tokens of a (B, L) batch sit.

    Attributes:
        index: (M,) long, flat position b * L + l of each real token, in row-major order.
        batch: B.
        length: L.
    """

    index: Tensor
    batch: int
    length: int

    @classmethod
    def from_mask(cls, real: Tensor) -> Packing:
        """real (B, L) bool, True at real tokens."""
        batch, length = real.shape
        return cls(real.reshape(-1).nonzero().squeeze(1), batch, length)  # (M,)

    @property
    def positions(self) -> Tensor:
        """(M,) position l of each real token in its sentence."""
        return self.index % self.length

    def pack(self, x: Tensor) -> Tensor:
        """x (B, L, ...) -> the real tokens (M, ...)."""
        return x.flatten(0, 1).index_select(0, self.index)  # (M, ...)

    def unpack(self, rows: Tensor) -> Tensor:
        """rows (M, ...) -> (B, L, ...), zeros at the padding."""
        tail = rows.shape[1:]
        padded = rows.new_zeros(self.batch * self.length, *tail)  # (B * L, ...)
        return padded.index_copy_(0, self.index, rows).view(self.batch, self.length, *tail)
