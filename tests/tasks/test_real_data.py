"""Checks on the real data sets; skipped with a reason when they are not present."""

from __future__ import annotations

from pathlib import Path

import pytest

from qkv.data.readers import find_split, read_labelled, read_parallel
from qkv.tasks.classification import clean_text

pytestmark = pytest.mark.data


def test_multi30k_reads_and_aligns(data_dir: Path) -> None:
    root = data_dir / "multi30k"
    src, tgt = read_parallel(find_split(root, "train", "de"), find_split(root, "train", "en"))
    assert len(src) == len(tgt) == 29000
    test_src, _ = read_parallel(
        find_split(root, "test_2016_flickr", "de"), find_split(root, "test_2016_flickr", "en")
    )
    assert test_src[0].startswith("Ein Mann mit einem orangefarbenen Hut")


def test_imdb_reads_with_balanced_labels(data_dir: Path) -> None:
    texts, labels = read_labelled(data_dir / "imdb" / "test.jsonl.gz")
    assert len(texts) == 25000
    assert labels.count("0") == labels.count("1") == 12500
    assert "<br" not in clean_text(texts[0] + "<br /><br />end")
