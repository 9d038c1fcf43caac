from __future__ import annotations

from pathlib import Path

import pytest

from qkv.errors import file_in_the_way, os_problem


def test_a_file_where_a_directory_would_be_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "notes"
    blocker.write_text("x")
    target = blocker / "run" / "config.json"
    with pytest.raises(NotADirectoryError) as caught:
        target.parent.mkdir(parents=True)
    assert os_problem(caught.value) == f"{target.parent}: {blocker} is a file, not a directory"
    assert file_in_the_way(target) == blocker
    assert file_in_the_way(tmp_path / "a" / "b") is None


def test_other_errors_give_the_path_and_the_reason(tmp_path: Path) -> None:
    missing = tmp_path / "missing.txt"
    with pytest.raises(FileNotFoundError) as caught:
        missing.read_text()
    assert os_problem(caught.value) == f"{missing}: no such file or directory"
    assert os_problem(OSError("no path at all")) == "no path at all"
