from pathlib import Path

import pytest

from qkv.data.cache import check_same_data, load_id_lists, save_id_lists, text_digest
from qkv.errors import DataError


def test_round_trip(tmp_path: Path) -> None:
    corpora = {"train.src": [[5, 6, 7], [], [8]], "train.tgt": [[9], [10, 11]]}
    path = tmp_path / "cache" / "tokens.safetensors"
    save_id_lists(path, corpora)
    assert load_id_lists(path) == corpora
    assert not list(path.parent.glob("*.tmp"))


def test_missing_or_corrupt_cache_is_rebuilt(tmp_path: Path) -> None:
    assert load_id_lists(tmp_path / "absent.safetensors") is None
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x00\x01garbage")
    assert load_id_lists(broken) is None


def test_text_digest_tells_other_text_apart() -> None:
    base = text_digest(["a b", "c"], ["0", "1"])
    assert text_digest(["a b", "c"], ["0", "1"]) == base
    assert text_digest(["c", "a b"], ["1", "0"]) != base  # order
    assert text_digest(["a", "b c"], ["0", "1"]) != base  # where one text ends
    assert text_digest(["a b", "c", "0"], ["1"]) != base  # where one column ends


def test_check_same_data_names_the_file_that_changed(tmp_path: Path) -> None:
    path = tmp_path / "tokens.safetensors"
    save_id_lists(path, {"train.ids": [[1]]}, {"train": "aa", "valid": "bb"})
    check_same_data(path, {"train": (tmp_path / "t", "aa"), "valid": (tmp_path / "v", "bb")})
    with pytest.raises(DataError, match=r"v: does not hold the text this run was trained on"):
        check_same_data(path, {"train": (tmp_path / "t", "aa"), "valid": (tmp_path / "v", "cc")})
    save_id_lists(path, {"train.ids": [[1]]})  # written without digests: nothing to check
    check_same_data(path, {"train": (tmp_path / "t", "zz")})
    check_same_data(tmp_path / "absent.safetensors", {"train": (tmp_path / "t", "zz")})
