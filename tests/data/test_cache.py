import errno
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from qkv.data.cache import (
    StreamDigest,
    TokenCacheWriter,
    check_same_data,
    open_token_cache,
    text_digest,
)
from qkv.errors import DataError

ROWS = {"train.src": [[5, 6, 7], [], [8], [2**31 - 1]], "train.tgt": [[9], [10, 11], [], [0]]}


def write_cache(path: Path, digests: dict[str, str] | None = None) -> None:
    with TokenCacheWriter(path) as writer:
        for name, rows in ROWS.items():
            writer.add(name, rows[:2])  # in two chunks, as a stream is written
            writer.add(name, rows[2:])
        writer.finish(digests or {})


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "cache" / "tokens.safetensors"
    write_cache(path)
    cache = open_token_cache(path)
    assert cache is not None
    assert {name: rows.tolist() for name, rows in cache.arrays.items()} == ROWS
    source = cache.arrays["train.src"]
    assert source.on_disk and len(source) == 4
    assert source.lengths.tolist() == [3, 0, 1, 1]
    assert source[0].dtype == np.int32 and source[-1].tolist() == [2**31 - 1]
    assert [row.tolist() for row in source.rows([3, 0])] == [[2**31 - 1], [5, 6, 7]]
    assert list(path.parent.iterdir()) == [path]  # no temporary file or directory left


def test_the_cache_is_a_plain_safetensors_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens.safetensors"
    write_cache(path)
    tensors = load_file(str(path))
    assert tensors["train.tgt.offsets"].tolist() == [0, 1, 3, 3, 4]
    assert tensors["train.tgt.ids"].tolist() == [9, 10, 11, 0]


def test_missing_or_corrupt_cache_is_rebuilt(tmp_path: Path) -> None:
    assert open_token_cache(tmp_path / "absent.safetensors") is None
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x00\x01garbage")
    assert open_token_cache(broken) is None
    path = tmp_path / "tokens.safetensors"
    write_cache(path)
    whole = path.read_bytes()
    path.write_bytes(whole[:-3])  # cut short
    assert open_token_cache(path) is None
    flipped = bytearray(whole)
    flipped[-2] ^= 1  # an id changed: only the checksums tell
    path.write_bytes(bytes(flipped))
    assert open_token_cache(path, verify=False) is not None
    assert open_token_cache(path) is None


def test_a_cache_left_unfinished_leaves_nothing_and_the_old_one_whole(tmp_path: Path) -> None:
    path = tmp_path / "tokens.safetensors"
    write_cache(path)
    before = path.read_bytes()
    with pytest.raises(RuntimeError), TokenCacheWriter(path) as writer:
        writer.add("train.src", [[1, 2]])
        raise RuntimeError("interrupted")
    assert path.read_bytes() == before
    assert list(tmp_path.iterdir()) == [path]


def test_the_parts_of_a_build_that_was_killed_are_removed_by_the_next(tmp_path: Path) -> None:
    path = tmp_path / "tokens.safetensors"
    left = tmp_path / f"{path.name}.k1ll3d.tmp"
    left.mkdir()
    (left / "train.src.ids").write_bytes(b"\0" * 64)
    write_cache(path)
    assert list(tmp_path.iterdir()) == [path]


def test_text_digest_tells_other_text_apart() -> None:
    base = text_digest(["a b", "c"], ["0", "1"])
    assert text_digest(["a b", "c"], ["0", "1"]) == base
    assert text_digest(["c", "a b"], ["1", "0"]) != base  # order
    assert text_digest(["a", "b c"], ["0", "1"]) != base  # where one text ends
    assert text_digest(["a b", "c", "0"], ["1"]) != base  # where one column ends


def test_a_streamed_digest_is_the_text_digest() -> None:
    lines = [f"Satz {i} ü\u200b" for i in range(10)]
    digest = StreamDigest()
    digest.column(len(lines))
    for start in range(0, len(lines), 3):
        digest.update(lines[start : start + 3])
    assert digest.hexdigest() == text_digest(lines)
    short = StreamDigest()
    short.column(3)
    short.update(lines[:2])
    with pytest.raises(ValueError, match="misses 1"):
        short.hexdigest()


def test_check_same_data_names_the_file_that_changed(tmp_path: Path) -> None:
    path = tmp_path / "tokens.safetensors"
    write_cache(path, {"train": "aa", "valid": "bb"})
    check_same_data(path, {"train": (tmp_path / "t", "aa"), "valid": (tmp_path / "v", "bb")})
    with pytest.raises(DataError, match=r"v: does not hold the text this run was trained on"):
        check_same_data(path, {"train": (tmp_path / "t", "aa"), "valid": (tmp_path / "v", "cc")})
    for gone in (path, tmp_path / "absent.safetensors"):
        if gone == path:
            write_cache(path)  # written without digests: nothing to check
        with pytest.warns(UserWarning, match=f"{gone.name} is gone .*: {tmp_path / 't'} cannot"):
            check_same_data(gone, {"train": (tmp_path / "t", "zz")})


def test_a_full_disk_is_reported_with_the_cache_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(self: object, values: np.ndarray) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")  # as write() raises it

    monkeypatch.setattr("qkv.data.cache._Part.write", full)
    path = tmp_path / "cache" / "tokens.safetensors"
    with pytest.raises(DataError, match=r"tokens.safetensors: cannot write \(No space left"):
        write_cache(path)
    assert list(path.parent.iterdir()) == []  # nothing half-written left
