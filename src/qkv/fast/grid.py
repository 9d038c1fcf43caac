"""Where packed rows sit for attention: sentences sorted by length, in groups each padded to
its own longest. For cross-attention the keys' `Layout` follows the queries' `Grouping`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import torch
from torch import Tensor

from qkv.fast.packing import Packing

GROUP_COST = 2048  # a group's fixed cost, in score entries (B · T · S) it must save
MAX_GROUPS = 8


class _PerBatch(Protocol):
    @property
    def derived(self) -> dict[Any, Any]: ...


Holder = TypeVar("Holder", bound=_PerBatch)
Args = ParamSpec("Args")
T = TypeVar("T")


def per_batch(fn: Callable[Concatenate[Holder, Args], T]) -> Callable[Concatenate[Holder, Args], T]:
    """`fn(batch, *args)` computed once per `batch.derived` (a batch's `Packing`, or a `Layout`)
    and positional args: numbers, strings and dtypes by value, other objects by identity (the
    entry holds them, so that their ids are not reused)."""

    @functools.wraps(fn)
    def once(batch: Holder, *args: Args.args, **kwargs: Args.kwargs) -> T:
        assert not kwargs, "positional arguments only"
        key = (fn.__name__, *(a if isinstance(a, int | str | torch.dtype) else id(a) for a in args))
        if key not in batch.derived:
            batch.derived[key] = (args, fn(batch, *args, **kwargs))
        return batch.derived[key][1]

    return once


@dataclass(frozen=True)
class Grouping:
    """Sentences sorted by length, longest first, cut into groups."""

    order: Tensor  # (B,) long, the sentences in that order
    bounds: list[tuple[int, int]]  # (first, end) positions in `order` of each group


@dataclass(frozen=True)
class Layout:
    """Where one side's real rows sit in a grid of (parts · heads · total, K) rows: group g,
    B_g sentences padded to L_g positions, starts at slot `starts[g]`, its block viewing as
    (parts, heads · B_g, L_g, K). `base`, `span` and `local` (M,) long give each real row its
    group's start and B_g · L_g, and its slot in the group (sentence in group × L_g + position).
    """

    sizes: list[int]  # B_g
    lengths: list[int]  # L_g
    starts: list[int]
    total: int  # the slots of one head-part
    sentences: list[Tensor]  # (B_g,) long, each group's sentences
    base: Tensor
    span: Tensor
    local: Tensor
    derived: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    @per_batch
    def index(self, parts: int) -> Tensor:
        """(M · parts,) long: the grid row of each real row's head-parts, in the order of a
        (M, parts, K) view of the rows."""
        offsets = torch.arange(parts, device=self.base.device)  # (parts,)
        first = parts * self.base + self.local  # (M,)
        return (first[:, None] + offsets * self.span[:, None]).view(-1)

    def block(self, grid: Tensor, group: int, parts: int, heads: int) -> Tensor:
        """grid (parts · heads · total, K) -> group's (parts, heads · B_g, L_g, K) view."""
        per_part = parts * heads
        first = per_part * self.starts[group]
        slots = self.sizes[group] * self.lengths[group]
        rows = grid[first : first + per_part * slots]  # (P · B_g · L_g, K)
        return rows.view(parts, heads * self.sizes[group], self.lengths[group], grid.size(1))


@per_batch
def grouping(rows: Packing) -> Grouping:
    """The grouping of `rows`' sentences by their lengths."""
    extents = sentence_extents(rows)
    order = torch.argsort(extents, descending=True, stable=True)  # (B,)
    return Grouping(order, cut(extents[order].tolist()))


@per_batch
def sentence_extents(rows: Packing) -> Tensor:
    """(B,) long: 1 + the last real position of each sentence, 0 for an empty one."""
    real = rows.index[: rows.count]  # (M,)
    sentence, position = real // rows.length, real % rows.length
    extents = torch.zeros(rows.batch, dtype=torch.long, device=real.device)
    return extents.scatter_reduce_(0, sentence, position + 1, "amax")


def cut(lengths: list[int]) -> list[tuple[int, int]]:
    """Groups (first, end) of sentences of `lengths`, longest first: from one group, the cut
    saving the most score entries (B_g · L_g²) is made while it saves more than `GROUP_COST`,
    up to `MAX_GROUPS` groups."""
    lengths = [max(n, 1) for n in lengths]

    def cost(first: int, end: int) -> int:
        return (end - first) * lengths[first] ** 2

    def best_cut(first: int, end: int) -> tuple[int, int]:
        """(saving, position) of the best cut of [first, end), (0, -1) if none."""
        best = (0, -1)
        whole = cost(first, end)
        for i in range(first + 1, end):
            if lengths[i] < lengths[i - 1]:
                best = max(best, (whole - cost(first, i) - cost(i, end), i))
        return best

    bounds = [(0, len(lengths))] if lengths else []
    cuts = [best_cut(*b) for b in bounds]
    while cuts and len(bounds) < MAX_GROUPS:
        which = max(range(len(cuts)), key=lambda g: cuts[g][0])
        saving, at = cuts[which]
        if at < 0 or saving <= GROUP_COST:
            break
        first, end = bounds[which]
        bounds[which : which + 1] = [(first, at), (at, end)]
        cuts[which : which + 1] = [best_cut(first, at), best_cut(at, end)]
    return bounds


@per_batch
def layout(rows: Packing, groups: Grouping) -> Layout:
    """Where `rows` sit in `groups`."""
    extents = sentence_extents(rows)  # (B,)
    sentences = [groups.order[first:end] for first, end in groups.bounds]  # (B_g,) each
    sizes = [len(members) for members in sentences]
    lengths = [max(int(extents[members].max()), 1) for members in sentences]
    spans = [size * length for size, length in zip(sizes, lengths, strict=True)]
    starts = [sum(spans[:g]) for g in range(len(spans))]
    # Per sentence: its group's start and span, and the slot of its first position in the group.
    base, span, offset = (torch.empty_like(extents) for _ in range(3))  # (B,) each
    for members, start, width, length in zip(sentences, starts, spans, lengths, strict=True):
        base[members], span[members] = start, width
        offset[members] = torch.arange(len(members), device=extents.device) * length
    real = rows.index[: rows.count]  # (M,)
    sentence, position = real // rows.length, real % rows.length  # (M,) each
    local = offset[sentence] + position
    return Layout(
        sizes, lengths, starts, sum(spans), sentences, base[sentence], span[sentence], local
    )
