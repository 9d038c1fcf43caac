"""Token arrays: rows, lengths and passes, in memory and read in blocks."""

from __future__ import annotations

import numpy as np
import pytest

from qkv.data import token_array
from qkv.data.token_array import TokenArray, id_lists

ROWS = [[4, 5], [], [6], [7, 8, 9]]


def test_rows_lengths_and_lists() -> None:
    rows = TokenArray.from_lists(ROWS)
    assert len(rows) == 4 and not rows.on_disk
    assert rows.lengths.tolist() == [2, 0, 1, 3]
    assert rows[3].tolist() == [7, 8, 9] and rows[-4].tolist() == [4, 5]
    assert [row.tolist() for row in rows.rows(np.array([2, 0]))] == [[6], [4, 5]]
    assert rows.tolist() == ROWS == id_lists(rows) == id_lists(ROWS)
    assert rows.flat().tolist() == [4, 5, 6, 7, 8, 9]
    with pytest.raises(IndexError):
        rows[4]
    assert len(TokenArray.from_lists([])) == 0 and TokenArray.from_lists([]).tolist() == []


def test_passes_read_in_blocks_see_every_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(token_array, "READ_BLOCK", 3)
    rows = TokenArray.from_lists(ROWS * 2)
    assert rows.tolist() == ROWS * 2
    assert rows.lengths.tolist() == [2, 0, 1, 3] * 2
