"""Paths a user names: outputs that cannot be written, runs resumed from elsewhere, runs that
read their texts from fields of their own naming."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qkv.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--preset", "tiny", "vocab_size=60", "max_steps=2", "eval_every=2"]
WORDS = {"0": ["dull", "slow", "bad", "boring"], "1": ["warm", "funny", "good", "great"]}


def qkv(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def reviews(path: Path, count: int = 24) -> Path:
    """JSONL with the text under "review" and the label under "sentiment", 0 or 1."""
    rows = [
        {
            "review": f"a {WORDS[str(i % 2)][i % 4]} film, {WORDS[str(i % 2)][(i + 1) % 4]}",
            "sentiment": i % 2,
        }
        for i in range(count)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def review_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A classifier trained on texts under "review" and labels under "sentiment"."""
    root = tmp_path_factory.mktemp("reviews")
    fields = ["text_field=review", "label_field=sentiment"]
    data, run = reviews(root / "train.jsonl"), root / "run"
    assert (
        main(["train", "classification", "--train", str(data), "--out", str(run), *TINY, *fields])
        == 0
    )
    return run


def test_classify_reads_the_runs_text_field(
    review_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = qkv(
        capsys, "classify", review_run, "--input", reviews(tmp_path / "t.jsonl", 3)
    )
    assert code == 0, err
    assert [line.split("\t")[0] in ("0", "1") for line in out.splitlines()] == [True] * 3


def test_the_confusion_matrix_lines_up_when_counts_are_wider_than_labels(
    review_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = qkv(
        capsys, "evaluate", review_run, "--data", reviews(tmp_path / "e.jsonl", 60)
    )
    assert code == 0, err
    table = out.splitlines()[2:]  # after the scores and the table's caption
    assert len(table) == 3 and len({len(row) for row in table}) == 1, out
    counts = [int(v) for row in table[1:] for v in row.split()[1:]]
    assert sum(counts) == 60 and max(counts) >= 10


def test_resume_finds_the_data_from_another_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "data").mkdir()
    reviews(tmp_path / "data" / "train.jsonl")
    monkeypatch.chdir(tmp_path / "data")
    fields = ["text_field=review", "label_field=sentiment"]
    code, _, err = qkv(
        capsys,
        "train",
        "classification",
        "--train",
        "train.jsonl",
        "--out",
        "../run",
        *TINY,
        *fields,
    )
    assert code == 0, err
    monkeypatch.chdir(tmp_path.parent)
    code, _, err = qkv(capsys, "train", "--resume", tmp_path / "run", "max_steps=4")
    assert code == 0, err
    assert json.loads((tmp_path / "run" / "config.json").read_text())["data"]["train_file"] == str(
        tmp_path / "data" / "train.jsonl"
    )


def test_an_output_that_cannot_be_made_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = reviews(tmp_path / "train.jsonl")
    fields = ["text_field=review", "label_field=sentiment"]
    code, _, err = qkv(
        capsys, "train", "classification", "--train", data, "--out", data / "run", *TINY, *fields
    )
    assert code == 2
    assert err.count("\n") == 1 and err.startswith(f"qkv: {data}"), err
