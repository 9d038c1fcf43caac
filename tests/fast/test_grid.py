import pytest
import torch

import qkv.fast.grid as grid
from qkv.fast.grid import cut, grouping, layout, sentence_extents
from qkv.fast.packing import Packing


def test_sentences_of_one_length_make_one_group() -> None:
    assert cut([20] * 100) == [(0, 100)]
    assert cut([]) == []


def test_a_batch_of_long_and_short_sentences_is_cut_where_the_length_drops() -> None:
    lengths = [40] * 10 + [8] * 90  # one group: 100 · 40² score entries; two: 10 · 40² + 90 · 8²
    assert cut(lengths) == [(0, 10), (10, 100)]


def test_cuts_stop_at_the_cost_of_a_group_and_at_the_most_groups(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lengths = [12, 11, 10, 9, 8, 7, 6, 5, 4, 3]
    assert len(cut(lengths)) == 1  # no cut saves GROUP_COST
    monkeypatch.setattr(grid, "GROUP_COST", 0)
    assert len(cut(lengths)) == grid.MAX_GROUPS
    monkeypatch.setattr(grid, "MAX_GROUPS", 3)
    bounds = cut(lengths)
    assert len(bounds) == 3
    assert [first for first, _ in bounds[1:]] == [end for _, end in bounds[:-1]]  # contiguous
    assert bounds[0][0] == 0 and bounds[-1][1] == len(lengths)


def test_every_real_row_gets_its_own_slot_inside_its_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(grid, "GROUP_COST", 0)
    ids = torch.tensor([[5, 6, 0, 0, 0], [5, 6, 7, 8, 9], [0, 0, 0, 0, 0], [5, 0, 0, 0, 0]])
    rows = Packing.from_mask(ids != 0, round_rows=True)
    assert sentence_extents(rows).tolist() == [2, 5, 0, 1]
    groups = grouping(rows)
    assert groups.order.tolist() == [1, 0, 3, 2]  # longest first, stable
    placed = layout(rows, groups)
    assert grouping(rows) is groups and layout(rows, groups) is placed  # computed once
    assert sum(placed.sizes) == 4 and all(length >= 1 for length in placed.lengths)
    slots = placed.base + placed.local  # (M,) in a grid of one head-part
    assert len(set(slots.tolist())) == rows.count
    ends = [
        start + size * length
        for start, size, length in zip(placed.starts, placed.sizes, placed.lengths, strict=True)
    ]
    assert ends[-1] == placed.total
    for slot, base, span in zip(
        slots.tolist(), placed.base.tolist(), placed.span.tolist(), strict=True
    ):
        assert base <= slot < base + span
    # Two head-parts: each row's second part one group-block further on.
    index = placed.index(2).view(rows.count, 2)
    torch.testing.assert_close(index[:, 0], 2 * placed.base + placed.local)
    torch.testing.assert_close(index[:, 1], index[:, 0] + placed.span)


def test_a_block_views_the_group_as_heads_times_sentences() -> None:
    ids = torch.tensor([[5, 6, 7], [8, 9, 0]])
    rows = Packing.from_mask(ids != 0)
    placed = layout(rows, grouping(rows))
    heads, parts, width = 2, 3, 4
    values = torch.arange(rows.count * parts * heads, dtype=torch.float32)
    flat = torch.zeros(parts * heads * placed.total, width)
    flat.index_copy_(0, placed.index(parts * heads), values[:, None].expand(-1, width))
    block = placed.block(flat, 0, parts, heads)  # (P, H · B, L, K)
    assert block.shape == (parts, heads * 2, 3, width)
    # Row 4 (sentence 1, position 1), part 2 (v), head 1: value 4 · 6 + 2 · 2 + 1.
    assert block[2, 1 * 2 + 1, 1, 0] == 4 * 6 + 2 * 2 + 1
