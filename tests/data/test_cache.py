from pathlib import Path

from qkv.data.cache import load_id_lists, save_id_lists


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
