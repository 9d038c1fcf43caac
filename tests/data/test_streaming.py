"""Parallel text streamed into a token cache: the ids, filter and digests of the whole text."""

from __future__ import annotations

from pathlib import Path

import pytest

from qkv.data.cache import TokenCacheWriter, open_token_cache, text_digest
from qkv.data.streaming import ParallelFiles, tokenize_pairs
from qkv.data.tokenizer import Tokenizer
from qkv.errors import DataError

WORDS = ["ein", "Hund", "läuft", "über", "die", "Wiese", "zwei", "Katzen", "schlafen"]
SOURCES = [" ".join(WORDS[(i * 7 + k) % 9] for k in range(1 + i % 6)) for i in range(50)]
TARGETS = [line.upper() for line in SOURCES]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.train(SOURCES + TARGETS, vocab_size=60, min_frequency=1)


def write_pairs(directory: Path, sources: list[str], targets: list[str]) -> ParallelFiles:
    (directory / "train.de").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    (directory / "train.en").write_text("".join(t + "\n" for t in targets), encoding="utf-8")
    return ParallelFiles.counted(directory / "train.de", directory / "train.en")


def test_streamed_ids_and_digests_are_those_of_the_whole_text(
    tokenizer: Tokenizer, tmp_path: Path
) -> None:
    files = write_pairs(tmp_path, SOURCES, TARGETS)
    path = tmp_path / "tokens.safetensors"
    with TokenCacheWriter(path) as writer:
        done = tokenize_pairs(tokenizer, files, writer, ("s", "t"), limit=12, chunk_lines=7)
        writer.finish({})
    src, tgt = tokenizer.encode_batch(SOURCES), tokenizer.encode_batch(TARGETS)
    kept = [i for i in range(50) if 0 < len(src[i]) < 12 and len(tgt[i]) < 12]
    assert 0 < len(kept) < 50  # the limit bites
    cache = open_token_cache(path)
    assert cache is not None
    assert cache.arrays["s"].tolist() == [src[i] for i in kept]
    assert cache.arrays["t"].tolist() == [tgt[i] for i in kept]
    assert (done.read, done.kept) == (50, len(kept))
    assert (done.src_digest, done.tgt_digest) == (text_digest(SOURCES), text_digest(TARGETS))
    assert files.digests() == (text_digest(SOURCES), text_digest(TARGETS))


def test_a_bad_line_stops_tokenizing_with_its_place_and_leaves_no_cache(
    tokenizer: Tokenizer, tmp_path: Path
) -> None:
    files = write_pairs(tmp_path, SOURCES, [*TARGETS[:40], " ", *TARGETS[41:]])
    path = tmp_path / "cache" / "tokens.safetensors"
    with (
        pytest.raises(DataError, match=r"train\.en:41: empty line"),
        TokenCacheWriter(path) as writer,
    ):
        tokenize_pairs(tokenizer, files, writer, ("s", "t"), limit=12, chunk_lines=7)
    assert list(path.parent.iterdir()) == []


def test_a_sample_for_the_tokenizer_is_spread_over_both_sides(tmp_path: Path) -> None:
    files = write_pairs(tmp_path, SOURCES, TARGETS)
    assert list(files.texts()) == SOURCES + TARGETS
    assert list(files.texts(cap=10)) == SOURCES[::5] + TARGETS[::5]
    assert list(files.texts(cap=12)) == SOURCES[::5] + TARGETS[::5]  # at most the cap


@pytest.mark.parametrize("change", [5, -5])
def test_pairs_that_change_while_they_are_read_are_named(tmp_path: Path, change: int) -> None:
    """Both sides grown (or cut) alike between their count and their reading."""
    files = write_pairs(tmp_path, SOURCES, TARGETS)
    changed = ParallelFiles(files.src, files.tgt, files.lines - change)  # as counted before
    with pytest.raises(DataError, match="changed while it was read together with"):
        list(changed.chunks(7))
    with pytest.raises(DataError, match="changed while it was read together with"):
        changed.digests()
