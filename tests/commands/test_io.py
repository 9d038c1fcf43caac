"""The commands' inputs, read a chunk at a time, and outputs, written as they come."""

from __future__ import annotations

import gzip
import io
import os
import sys
from pathlib import Path

import pytest

from qkv.commands.io import in_place, input_chunks, output_lines
from qkv.errors import DataError


def test_stdin_is_read_a_chunk_at_a_time_gzipped_or_not(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "\ufeffeins\r\n\nzwei\ndrei\nvier".encode()
    for data in (text, gzip.compress(text)):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
        assert list(input_chunks(None, 2)) == [["eins", ""], ["zwei", "drei"], ["vier"]]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    assert list(input_chunks("-")) == []  # empty stdin: no lines (an empty file is refused)


def test_an_output_file_is_replaced_whole_or_not_at_all(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    out.write_text("before\n", encoding="utf-8")
    out.chmod(0o600)
    with pytest.raises(KeyboardInterrupt), output_lines(str(out)) as write:
        write(["one", "two"])
        raise KeyboardInterrupt  # Ctrl-C between two chunks
    assert out.read_text(encoding="utf-8") == "before\n" and list(tmp_path.iterdir()) == [out]
    with output_lines(str(out)) as write:
        write(["one"])
        (temporary,) = [path for path in tmp_path.iterdir() if path != out]
        assert temporary.stat().st_mode & 0o777 == 0o600  # while it is written: its owner's
        write(["two", "three"])
    assert out.read_text(encoding="utf-8") == "one\ntwo\nthree\n"
    assert out.stat().st_mode & 0o777 == 0o600  # its permissions kept


def test_stdout_is_written_as_the_lines_come(capsys: pytest.CaptureFixture[str]) -> None:
    with output_lines(None) as write:
        write(["one"])
        assert capsys.readouterr().out == "one\n"
        write([])
        write(["two"])
    assert capsys.readouterr().out == "two\n"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_a_failed_write_names_the_output_and_the_block_s_own_errors_pass(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="/dev/full: cannot write"), output_lines("/dev/full") as w:
        w(["a line"])  # a full disk
    out = tmp_path / "out.txt"
    with pytest.raises(OSError, match="the block's own"), output_lines(str(out)) as write:
        write(["one"])
        raise OSError("the block's own")  # not a failure to write the output
    assert list(tmp_path.iterdir()) == []


def test_a_killed_run_s_temporary_output_is_removed_by_the_next(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    (tmp_path / ".out.txt.k1ll3d.tmp").write_text("part of an output\n")
    with output_lines(str(out)) as write:
        write(["one"])
    assert list(tmp_path.iterdir()) == [out]


def test_only_names_of_open_files_are_written_in_place(tmp_path: Path) -> None:
    """/dev/stdout may be a file the shell opened (`>> log`); a regular file elsewhere under
    /dev (/dev/shm) is replaced as any other is."""
    assert in_place(Path("/dev/null")) and in_place(Path(f"/proc/self/fd/{sys.stderr.fileno()}"))
    regular = tmp_path / "out.txt"
    regular.write_text("before\n")
    assert not in_place(regular)
    if Path("/dev/shm").is_dir():
        shm = Path("/dev/shm") / f"qkv-test-{os.getpid()}.txt"
        try:
            for _ in range(2):
                with output_lines(str(shm)) as write:
                    write(["one"])
            assert not in_place(shm) and shm.read_text() == "one\n"
        finally:
            shm.unlink(missing_ok=True)
