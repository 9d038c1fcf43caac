"""The real tokens of a padded batch as rows. On a CPU the M rows are rounded up to M' rows that
the linear layers multiply uncopied (`padded_rows`), the fillers copies of the first token.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar

import torch
from torch import Tensor

from qkv.fast.linear import padded_rows


@dataclass(frozen=True)
class Packing:
    """Where the real tokens of a (B, L) batch sit."""

    index: Tensor  # (M',) long, flat position b * L + l of each real token, then the fillers
    batch: int  # B
    length: int  # L
    count: int  # M, the real tokens
    # computed once per batch for all its layers (`per_batch`: attention's masks, say)
    derived: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_mask(cls, real: Tensor, round_rows: bool = False) -> Packing:
        """real (B, L) bool, True at real tokens; `round_rows` adds filler rows up to
        `padded_rows(M)`."""
        batch, length = real.shape
        index = real.reshape(-1).nonzero().squeeze(1)  # (M,)
        count = len(index)
        if round_rows and count > 0:
            filler = index[:1].expand(padded_rows(count) - count)  # (M' - M,)
            index = torch.cat([index, filler])  # (M',)
        return cls(index, batch, length, count)

    @property
    def positions(self) -> Tensor:
        """(M',) position l of each row in its sentence."""
        return self.index % self.length

    def pack(self, x: Tensor) -> Tensor:
        """x (B, L, ...) -> the rows (M', ...)."""
        return x.flatten(0, 1).index_select(0, self.index)  # (M', ...)

    def unpack(self, rows: Tensor) -> Tensor:
        """rows (M', ...) -> (B, L, ...), zeros at the padding; filler rows are left out."""
        tail = rows.shape[1:]
        padded = rows.new_zeros(self.batch * self.length, *tail)  # (B * L, ...)
        real = self.index[: self.count]  # (M,)
        padded.index_copy_(0, real, rows[: self.count])
        return padded.view(self.batch, self.length, *tail)  # (B, L, ...)


Args = ParamSpec("Args")
T = TypeVar("T")


def per_batch(
    fn: Callable[Concatenate[Packing, Args], T],
) -> Callable[Concatenate[Packing, Args], T]:
    """`fn(rows, *args)` computed once per batch (its `Packing`) and positional args: numbers,
    strings and dtypes by value, other objects by identity (the entry holds them, so that
    their ids are not reused)."""

    @functools.wraps(fn)
    def once(rows: Packing, *args: Args.args, **kwargs: Args.kwargs) -> T:
        assert not kwargs, "positional arguments only"
        key = (fn.__name__, *(a if isinstance(a, int | str | torch.dtype) else id(a) for a in args))
        if key not in rows.derived:
            rows.derived[key] = (args, fn(rows, *args, **kwargs))
        return rows.derived[key][1]

    return once
