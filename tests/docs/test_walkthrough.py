"""docs/walkthrough.md: every python block runs, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

WALKTHROUGH = Path(__file__).resolve().parents[2] / "docs" / "walkthrough.md"
# A fenced block opened by ```python (at the start of a line) and closed by the next ``` line.
PYTHON_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)


def python_blocks() -> list[str]:
    return PYTHON_BLOCK.findall(WALKTHROUGH.read_text(encoding="utf-8"))


def test_walkthrough_has_its_code() -> None:
    assert len(python_blocks()) >= 8, f"{WALKTHROUGH} has lost its python blocks"


def test_every_block_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the plot is written to the working directory
    namespace: dict[str, Any] = {"__name__": "walkthrough"}
    for number, code in enumerate(python_blocks(), start=1):
        first_line = next((line for line in code.splitlines() if line.strip()), "")
        try:
            exec(compile(code, f"{WALKTHROUGH.name} block {number}", "exec"), namespace)
        except Exception as error:
            pytest.fail(f"block {number} ({first_line!r}) raised {type(error).__name__}: {error}")
    assert (tmp_path / "positional_encoding.png").is_file()
