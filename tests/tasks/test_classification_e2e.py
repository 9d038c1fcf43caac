"""Tiny classification runs end to end on generated labelled text."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from qkv.cli import main
from qkv.inference.classifier import Classifier

WORDS = {
    "pos": ["great", "wonderful", "superb", "loved", "brilliant"],
    "neg": ["awful", "boring", "terrible", "hated", "dull"],
    "mixed": ["okay", "average", "fine", "mediocre", "passable"],
}
FILLER = ["the", "film", "plot", "actors", "was", "and", "a", "story", "really", "very"]


def make_rows(n: int, labels: list[str], seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.choice(labels)
        words = rng.choices(FILLER, k=rng.randint(4, 30)) + rng.choices(WORDS[label], k=2)
        rng.shuffle(words)
        rows.append({"text": " ".join(words), "label": label})
    return rows


def write_jsonl(path: Path, rows: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def three_class_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("classification")
    train = write_jsonl(root / "train.jsonl", make_rows(600, ["pos", "neg", "mixed"], seed=1))
    run = root / "run"
    assert (
        main(
            [
                "train",
                "classification",
                "--train",
                str(train),
                "--out",
                str(run),
                "--preset",
                "tiny",
                "max_steps=120",
                "eval_every=40",
                "vocab_size=200",
                "threads=2",
            ]
        )
        == 0
    )
    return run


def test_learns_three_classes(
    three_class_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    test = write_jsonl(tmp_path / "test.jsonl", make_rows(150, ["pos", "neg", "mixed"], seed=9))
    assert main(["evaluate", str(three_class_run), "--data", str(test), "--json"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["labels"] == ["mixed", "neg", "pos"]
    assert scores["accuracy"] > 0.9, scores
    assert len(scores["confusion"]) == 3


def test_padding_does_not_change_predictions(three_class_run: Path) -> None:
    classifier = Classifier.load(three_class_run)
    short = "loved it"
    others = [" ".join(["the film was really very boring"] * 6), "an okay story"]
    alone = classifier.probabilities([short])[0]
    batched = classifier.probabilities([short, *others])[0]
    assert (alone - batched).abs().max() < 1e-5


def test_classify_command(
    three_class_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("a superb film\nawful and boring\n", encoding="utf-8")
    assert main(["classify", str(three_class_run), "--input", str(texts), "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["label"] for x in lines] == ["pos", "neg"]
    assert all(0.0 < x["probability"] <= 1.0 for x in lines)
    predictions = Classifier.load(three_class_run).predict(["superb", "terrible"])
    assert [label for label, _ in predictions] == ["pos", "neg"]


def test_files_with_other_field_names_are_read_by_the_field_flags(
    three_class_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"review": r["text"], "stars": r["label"]} for r in make_rows(30, ["pos", "neg"], 7)]
    other = write_jsonl(tmp_path / "other.jsonl", rows)
    run = str(three_class_run)
    assert main(["evaluate", run, "--data", str(other)]) == 2
    assert "missing field 'text'" in (err := capsys.readouterr().err)
    assert err.rstrip().endswith("name another with --text-field NAME"), err
    flags = ["--text-field", "review", "--label-field", "stars"]
    assert main(["evaluate", run, "--data", str(other), *flags, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["examples"] == 30
    assert main(["classify", run, "--input", str(other), "--text-field", "review"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 30
    assert main(["classify", run, "--text-field", "review"]) == 2
    assert "--text-field names a field of records, and stdin is read as lines" in (
        capsys.readouterr().err
    )
    lines = write_lines_file(tmp_path / "other.txt", [r["review"] for r in rows])
    assert main(["classify", run, "--input", str(lines), "--text-field", "review"]) == 2
    assert f"and {lines} is read as lines of text: give a file named .jsonl" in (
        capsys.readouterr().err
    )
    assert main(["classify", run, "--input", str(lines), "--output", str(lines)]) == 2
    assert f"qkv: {lines}: is the input file, which the output would replace" in (
        capsys.readouterr().err
    )
    assert lines.read_text(encoding="utf-8").splitlines()[0] == rows[0]["review"]


def write_lines_file(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_lines_that_look_like_json_records_are_warned_of(
    three_class_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = write_jsonl(tmp_path / "records.ndjson", make_rows(3, ["pos"], 1))
    assert main(["classify", str(three_class_run), "--input", str(records)]) == 0
    assert "warning: the first text looks like a JSON object" in capsys.readouterr().err
    assert (
        main(
            ["classify", str(three_class_run), "--input", str(records.rename(tmp_path / "r.jsonl"))]
        )
        == 0
    )
    assert capsys.readouterr().err == ""


def test_seed_preset_mirrors_the_tutorial() -> None:
    from qkv.presets import classification_preset

    model, train, data = classification_preset("seed")
    assert (model.d_model, model.n_encoder_layers, model.n_heads) == (128, 1, 1)
    assert model.head_dropout == 0.5 and data.max_len == 80 and train.max_epochs == 5
