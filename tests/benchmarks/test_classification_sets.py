"""The IMDB-made classification sets, from a small made-up IMDB: files, labels, cuts, noise."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
RATINGS = [1, 2, 3, 4, 7, 8, 9, 10]


@pytest.fixture
def sets(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    sys.modules.pop("classification_sets", None)
    import classification_sets as module

    return module


def long(i: int) -> str:
    """Every third review: 100 more words, past the `short` set's cut."""
    return " and on" * 50 if i % 3 == 0 else ""


def fake_imdb(directory: Path, n: int) -> Path:
    directory.mkdir()
    for split in ("train", "test"):
        rows = [
            {
                "text": f"Review {i} starts here. It goes on{long(i)}.<br /><br />"
                f"My verdict: {i} stars!",
                "label": int(RATINGS[i % 8] >= 7),
                "rating": RATINGS[i % 8],
            }
            for i in range(n)
        ]
        with gzip.open(directory / f"{split}.jsonl.gz", "wt", encoding="utf-8") as out:
            out.write("".join(json.dumps(row) + "\n" for row in rows))
    return directory


def read(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def run(sets: ModuleType, monkeypatch: pytest.MonkeyPatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", ["classification_sets.py", *args])
    sets.main()


def test_the_sets_are_cut_and_labelled_as_documented(
    sets: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    imdb = fake_imdb(tmp_path / "imdb", 40)
    run(sets, monkeypatch, str(tmp_path / "out"), "--imdb", str(imdb))
    out = tmp_path / "out"
    for train, test in sets.SETS.items():
        assert read(out / f"{train}.train.jsonl") and read(out / f"{test}.jsonl")
    assert {r["text"] for r in read(out / "first.train.jsonl")} == {
        f"Review {i} starts here." for i in range(40)
    }
    assert all(r["text"].startswith("My verdict:") for r in read(out / "last.test.jsonl"))
    assert {r["label"] for r in read(out / "multi.train.jsonl")} == {
        "awful",
        "poor",
        "good",
        "great",
    }
    assert {r["text"].split()[1] for r in read(out / "short.test.jsonl")} == {
        str(i) for i in range(40) if not long(i)
    }
    clean, noisy = read(out / "imdb5k.train.jsonl"), read(out / "noisy5k.train.jsonl")
    assert [r["text"] for r in clean] == [r["text"] for r in noisy]
    flipped = sum(a["label"] != b["label"] for a, b in zip(clean, noisy, strict=True))
    assert 0 < flipped < len(clean)


def test_the_linear_reference_needs_scikit_learn_or_prints_each_sets_accuracy(
    sets: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    imdb = fake_imdb(tmp_path / "imdb", 40)
    out = str(tmp_path / "out")
    run(sets, monkeypatch, out, "--imdb", str(imdb))
    capsys.readouterr()
    try:
        import sklearn  # noqa: F401
    except ImportError:
        with pytest.raises(SystemExit, match="pip install scikit-learn"):
            run(sets, monkeypatch, out, "--linear")
        return
    run(sets, monkeypatch, out, "--linear")
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in printed] == list(sets.SETS)
