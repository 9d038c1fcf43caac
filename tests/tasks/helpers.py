"""Corpora written to disk for the end-to-end tests."""

from __future__ import annotations

from pathlib import Path

from qkv.tasks.dates import generate_date_pairs


def write_pairs(directory: Path, split: str, pairs: list[tuple[str, str]]) -> None:
    """`split`.src and `split`.tgt, one pair per line."""
    (directory / f"{split}.src").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    (directory / f"{split}.tgt").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")


def write_dates(directory: Path, train: int, val: int) -> Path:
    """A date-translation corpus (train seed 1, val seed 2) written into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    write_pairs(directory, "train", generate_date_pairs(train, seed=1))
    write_pairs(directory, "val", generate_date_pairs(val, seed=2))
    return directory
