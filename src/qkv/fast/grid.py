"""Where packed rows sit for attention: sentences sorted by length, in groups each padded to
its own longest.

Padding a batch to its longest sentence spends attention's products on padding (B·L² against
the Σ L_b² the sentences need); groups of similar lengths waste little. A group costs a dozen
more calls, so a cut is made only where it saves more than `GROUP_COST`. For cross-attention
the keys' `Layout` follows the queries' `Grouping`, so a group holds the same sentences on
both sides.
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
    """`make()` once per `store` (a batch's `Packing.derived` or `Layout.derived`) and `keys`.

    Numbers, strings and dtypes are keys by value, other objects by identity; the entry holds
    them, so that no id in a key is reused for another object while the entry is kept.
    """
    key = tuple(k if isinstance(k, int | str | torch.dtype) else id(k) for k in keys)
    if key not in store:
        store[key] = (keys, make())
    held = store[key]
    assert isinstance(held, tuple)
    return cast(T, held[1])


@dataclass(frozen=True)
class Grouping:
    """Sentences sorted by length, longest first, cut into groups.

    Attributes:
        order: (B,) long, the sentences in that order.
        bounds: (first, end) positions in `order` of each group.
    """

    order: Tensor
    bounds: list[tuple[int, int]]


@dataclass(frozen=True)
class Layout:
    """Where one side's real rows sit in a grouped grid.

    Group g holds B_g sentences padded to L_g positions, B_g · L_g slots from `starts[g]`. A
    grid of P = parts × heads head-parts is (P · total, K) rows, group by group and within a
    group head-part by head-part, so a group's block views as (parts, heads · B_g, L_g, K).

    Attributes:
        groups: the grouping it follows.
        sizes: B_g of each group. lengths: L_g. starts: the first slot of each group.
        total: the slots of one head-part.
        sentences: (B_g,) long of each group, its sentences (for the mask).
        base, span, local: (M,) long each, of each real row: its group's start and B_g · L_g,
            and its slot in the group (sentence in group × L_g + position).
        derived: what is computed from the layout once for all of a batch's layers (indexes,
            the groups' masks; `derived`).
    """

    groups: Grouping
    sizes: list[int]
    lengths: list[int]
    starts: list[int]
    total: int
    sentences: list[Tensor]
    base: Tensor
    span: Tensor
    local: Tensor
    derived: dict[object, object] = field(default_factory=dict, compare=False, repr=False)

    def index(self, parts: int) -> Tensor:
        """(M · parts,) long: the grid row of each real row's head-parts, row by row, in the
        order of a (M, parts, K) view of the rows (made once per number of parts)."""

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
    """(B,) long: 1 + the last real position of each sentence, 0 for an empty one (computed
    once per packing)."""

    def make() -> Tensor:
        real = rows.index[: rows.count]  # (M,)
        sentence, position = real // rows.length, real % rows.length
        extents = torch.zeros(rows.batch, dtype=torch.long, device=real.device)
        return extents.scatter_reduce_(0, sentence, position + 1, "amax")

    return derived(rows.derived, make, "extents")


def cut(lengths: list[int]) -> list[tuple[int, int]]:
    """Groups of consecutive sentences, lengths sorted longest first: bounds (first, end).

    Starting from one group, the cut that saves the most score entries (B_g · L_g²) is made
    while it saves more than `GROUP_COST`, up to `MAX_GROUPS` groups.
    """
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
    device = extents.device
    sizes, lengths, starts, sentences = [], [], [], []
    start = 0
    for first, end in groups.bounds:
        members = groups.order[first:end]  # (B_g,)
        length = max(int(extents[members].max()), 1)
        sizes.append(end - first)
        lengths.append(length)
        starts.append(start)
        sentences.append(members)
        start += (end - first) * length
    # Per sentence: its group, its place in the group.
    rank = torch.empty_like(groups.order)
    rank[groups.order] = torch.arange(len(groups.order), device=device)  # (B,)
    firsts = torch.tensor([first for first, _ in groups.bounds], device=device)  # (G,)
    group = torch.bucketize(rank, firsts, right=True) - 1  # (B,)
    starts_t = torch.tensor(starts, device=device)  # (G,)
    spans_t = torch.tensor([b * n for b, n in zip(sizes, lengths, strict=True)], device=device)
    lengths_t = torch.tensor(lengths, device=device)  # (G,)

    real = rows.index[: rows.count]  # (M,)
    sentence, position = real // rows.length, real % rows.length  # (M,) each
    row_group = group[sentence]  # (M,)
    local = (rank[sentence] - firsts[row_group]) * lengths_t[row_group] + position  # (M,)
    return Layout(
        groups,
        sizes,
        lengths,
        starts,
        start,
        sentences,
        starts_t[row_group],
        spans_t[row_group],
        local,
    )
