"""Arbitrary input: readers fail only with DataError, the tokenizer never fails."""

from __future__ import annotations

import contextlib
import gzip
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.data.readers import read_labelled, read_lines, read_texts
from qkv.data.tokenizer import Tokenizer
from qkv.errors import DataError

FUZZ = settings(max_examples=75, deadline=None)
SUFFIXES = [".txt", ".jsonl", ".json", ".csv", ".tsv"]

# Bytes that look like the files the readers expect, mixed with noise.
FRAGMENTS = st.sampled_from(
    [
        *(b"\n", b"\r\n", b",", b"\t", b'"', b"{", b"}", b"[", b":", b" ", b"1", b"null"),
        *(b'"text"', b'"label"', b"text,label\n", b"text\tlabel\n"),
        *(b"\xff", b"\xc3", b"\xef\xbb\xbf", b"\x00"),
    ]
)
LOOKALIKE_BYTES = st.lists(st.one_of(FRAGMENTS, st.binary(max_size=8)), max_size=30).map(b"".join)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    texts = ["Zwei junge Männer stehen draußen.", "Two young men stand outside."] * 20
    return Tokenizer.train(texts, vocab_size=120)


def write(workdir: Path, name: str, data: bytes, compress: bool) -> Path:
    path = workdir / (name + (".gz" if compress else ""))
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


@FUZZ
@given(data=LOOKALIKE_BYTES, suffix=st.sampled_from(SUFFIXES), compress=st.booleans())
def test_readers_raise_only_data_error(
    workdir: Path, data: bytes, suffix: str, compress: bool
) -> None:
    path = write(workdir, "input" + suffix, data, compress)
    for read in (read_lines, read_labelled, read_texts):
        try:
            read(path)
        except DataError as error:
            assert path.name in str(error)


@FUZZ
@given(data=st.binary(max_size=200), cut=st.integers(min_value=0, max_value=60))
def test_damaged_gzip_raises_only_data_error(workdir: Path, data: bytes, cut: int) -> None:
    packed = gzip.compress(data)
    path = workdir / "damaged.jsonl.gz"
    path.write_bytes(packed[: max(len(packed) - cut, 2)])
    for read in (read_lines, read_labelled):
        with contextlib.suppress(DataError):
            read(path)


@FUZZ
@given(text=st.text(max_size=200))
def test_tokenizer_never_crashes(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    assert all(0 <= i < tokenizer.vocab_size for i in ids)
    assert tokenizer.encode_batch([text, text]) == [ids, ids]
    assert isinstance(tokenizer.decode(ids), str)


@FUZZ
@given(ids=st.lists(st.integers(min_value=-5, max_value=500), max_size=50))
def test_decode_arbitrary_ids(tokenizer: Tokenizer, ids: list[int]) -> None:
    assert isinstance(tokenizer.decode(ids), str)
    assert len(tokenizer.decode_batch([ids, ids[::-1]])) == 2
