"""Where packed rows sit for attention: sentences sorted by length, in groups each padded to
its own longest. For cross-attention the keys' `Layout` follows the queries' `Grouping`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar, cast

import torch
from torch import Tensor

from qkv.fast.packing import Packing

GROUP_COST = 2048  # a group's fixed cost, in score entries (B · T · S) it must save
MAX_GROUPS = 8

T = TypeVar("T")


def derived(store: dict[object, object], make: Callable[[], T], *keys: object) -> T:
    """`make()` once per `store` (a batch's `Packing.derived` or `Layout.derived`) and `keys`:
    numbers, strings and dtypes by value, other objects by identity (the entry holds them, so
    that their ids are not reused)."""
    key = tuple(k if isinstance(k, int | str | torch.dtype) else id(k) for k in keys)
    if key not in store:
        store[key] = (keys, make())
    held = store[key]
    assert isinstance(held, tuple)
    return cast(T, held[1])


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
    derived: dict[object, object] = field(default_factory=dict, compare=False, repr=False)

    def index(self, parts: int) -> Tensor:
        """(M · parts,) long: the grid row of each real row's head-parts, in the order of a
        (M, parts, K) view of the rows."""

        def make() -> Tensor:
            offsets = torch.arange(parts, device=self.base.device)  # (parts,)
            first = parts * self.base + self.local  # (M,)
            return (first[:, None] + offsets * self.span[:, None]).view(-1)

        return derived(self.derived, make, "index", parts)

    def block(self, grid: Tensor, group: int, parts: int, heads: int) -> Tensor:
        """grid (parts · heads · total, K) -> group's (parts, heads · B_g, L_g, K) view."""
        per_part = parts * heads
        first = per_part * self.starts[group]
        slots = self.sizes[group] * self.lengths[group]
        rows = grid[first : first + per_part * slots]  # (P · B_g · L_g, K)
        return rows.view(parts, heads * self.sizes[group], self.lengths[group], grid.size(1))


def grouping(rows: Packing) -> Grouping:
    """The grouping of `rows`' sentences by their lengths (computed once per packing)."""

    def make() -> Grouping:
        extents = sentence_extents(rows)
        order = torch.argsort(extents, descending=True, stable=True)  # (B,)
        return Grouping(order, cut(extents[order].tolist()))

    return derived(rows.derived, make, "grouping")


def layout(rows: Packing, groups: Grouping) -> Layout:
    """Where `rows` sit in `groups` (computed once per packing and grouping)."""
    return derived(rows.derived, lambda: _layout(rows, groups), "layout", groups)


def sentence_extents(rows: Packing) -> Tensor:
    """(B,) long: 1 + the last real position of each sentence, 0 for an empty one."""

    def make() -> Tensor:
        real = rows.index[: rows.count]  # (M,)
        sentence, position = real // rows.length, real % rows.length
        extents = torch.zeros(rows.batch, dtype=torch.long, device=real.device)
        return extents.scatter_reduce_(0, sentence, position + 1, "amax")

    return derived(rows.derived, make, "extents")


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


def _layout(rows: Packing, groups: Grouping) -> Layout:
    extents = sentence_extents(rows)  # (B,)
    # Per sentence: its group's start and span, and the slot of its first position in the group.
    base, span, offset = (torch.empty_like(extents) for _ in range(3))  # (B,) each
    sizes, lengths, starts, sentences = [], [], [], []
    start = 0
    for first, end in groups.bounds:
        members = groups.order[first:end]  # (B_g,)
        size, length = end - first, max(int(extents[members].max()), 1)
        base[members], span[members] = start, size * length
        offset[members] = torch.arange(size, device=extents.device) * length
        sizes.append(size)
        lengths.append(length)
        starts.append(start)
        sentences.append(members)
        start += size * length
    real = rows.index[: rows.count]  # (M,)
    sentence, position = real // rows.length, real % rows.length  # (M,) each
    local = offset[sentence] + position
    return Layout(sizes, lengths, starts, start, sentences, base[sentence], span[sentence], local)
