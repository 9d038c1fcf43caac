from __future__ import annotations

from qkv.commands.classify import confusion_lines, display_width


def test_display_width_counts_terminal_columns() -> None:
    assert display_width("pos") == 3
    assert display_width("好评") == 4  # wide characters take two columns
    assert display_width("👍") == 2
    assert display_width("é") == 1  # e and a combining accent
    assert display_width("a\u200db") == 2  # a zero-width joiner takes none


def test_the_confusion_matrix_lines_up_with_wide_labels() -> None:
    labels = ["👍", "👎", "neutral", "好评"]
    confusion = [[12, 0, 1, 0], [0, 7, 0, 1], [3, 0, 120, 0], [0, 0, 0, 5]]
    lines = confusion_lines(labels, confusion)
    assert len(lines) == 5
    assert {display_width(line) for line in lines} == {7 + 4 * (2 + 7)}
    assert lines[2].split() == ["👎", "0", "7", "0", "1"]
    assert lines[3].startswith("neutral  ") and lines[3].endswith("      0")
