"""Lines streamed a chunk at a time are the lines read whole, and errors keep their line."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from qkv.data.lines import count_lines, line_chunks
from qkv.data.readers import count_parallel, read_lines
from qkv.errors import DataError

TEXT = "\ufeffeins\r\nzwei\u2028drei\nvier\r\r\nfünf"


@pytest.mark.parametrize("size", [1, 2, 3, 100])
@pytest.mark.parametrize("end", ["", "\n", "\r\n"])
def test_chunks_hold_the_lines_read_whole(tmp_path: Path, size: int, end: str) -> None:
    path = tmp_path / "a.de"
    path.write_text(TEXT + end, encoding="utf-8")
    chunks = list(line_chunks(path, size))
    assert all(len(chunk) == size for chunk in chunks[:-1]) and 0 < len(chunks[-1]) <= size
    assert [line for chunk in chunks for line in chunk] == read_lines(path)
    assert read_lines(path) == ["eins", "zwei\u2028drei", "vier", "fünf"]
    assert count_lines(path) == 4


def test_a_bad_line_in_a_later_chunk_is_named_by_its_place_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "train.de.gz"
    path.write_bytes(gzip.compress(b"ein Satz\n" * 10 + b"\n" + b"ein Satz\n" * 5 + b"\xff\n"))
    assert count_lines(path) == 17
    chunks = line_chunks(path, 4)
    assert next(chunks) == ["ein Satz"] * 4  # read as needed: the bad lines are not seen yet
    with pytest.raises(DataError, match=r"train\.de\.gz:11: empty line"):
        list(chunks)
    with pytest.raises(DataError, match=r"train\.de\.gz:17: invalid UTF-8 \(byte 0xff"):
        list(line_chunks(path, 4, allow_empty=True))


def test_count_parallel_names_both_files(tmp_path: Path) -> None:
    (tmp_path / "a.de").write_text("x\ny\n")
    (tmp_path / "a.en").write_text("x\ny\nz")
    with pytest.raises(DataError, match=r"a\.de: has 2 lines but .*a\.en has 3"):
        count_parallel(tmp_path / "a.de", tmp_path / "a.en")
