"""The plan and the warnings, end to end: a run with no preset plans its schedule from the data,
and a run that ends in its warm-up says so and records it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qkv.cli import main
from tests.tasks.test_classification_e2e import make_rows, write_jsonl

pytestmark = pytest.mark.usefixtures("one_thread")


def records(run: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_run_without_a_preset_plans_from_the_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train = write_jsonl(tmp_path / "train.jsonl", make_rows(300, ["pos", "neg"], seed=1))
    run = tmp_path / "run"
    args = ["train", "classification", "--train", str(train), "--out", str(run)]
    small = ["d_model=32", "d_ff=64", "n_heads=2", "n_encoder_layers=1", "vocab_size=200"]
    assert main([*args, *small, "max_steps=60", "max_len=64"]) == 0
    out = capsys.readouterr().out
    assert "270 examples, 60 steps planned" in out  # 10 % held out for validation
    train_config = json.loads((run / "config.json").read_text())["train"]
    # The `strong` preset's warm-up of 300 and evaluation every 175 steps, scaled to 60 steps.
    assert train_config["warmup"] == 36 and train_config["eval_every"] == 12
    assert train_config["max_tokens"] < 32 * 512  # at least 50 batches a pass
    assert sum(1 for r in records(run) if r["split"] == "valid") >= 5
    # Small data: more regularisation than `strong`; the vocabulary given on the line is kept.
    assert "no preset: strong, fitted to 300 texts: dropout=0.3 weight_decay=0.1" in out
    config = json.loads((run / "config.json").read_text())
    assert config["model"]["dropout"] == 0.3 and train_config["weight_decay"] == 0.1
    assert config["data"]["vocab_size"] == 200


def test_a_run_without_a_preset_reads_the_fields_it_is_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"phrase": r["text"], "stars": r["label"]} for r in make_rows(100, ["pos", "neg"], 1)]
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    run = tmp_path / "run"
    args = ["train", "classification", "--train", str(train), "--out", str(run)]
    small = ["d_model=32", "d_ff=64", "n_heads=2", "n_encoder_layers=1", "vocab_size=200"]
    fields = ["text_field=phrase", "label_field=stars"]
    assert main([*args, *small, *fields, "max_steps=4"]) == 0
    assert "no preset: strong, fitted to 100 texts" in capsys.readouterr().out
    assert json.loads((run / "config.json").read_text())["data"]["labels"] == ["neg", "pos"]
    # Without them, the error names the setting that chooses the field.
    assert main([*args[:-1], str(tmp_path / "run2")]) == 2
    assert (
        "missing field 'text' (fields: 'phrase', 'stars'); name another with "
        "text_field=NAME" in capsys.readouterr().err
    )


def test_a_run_that_ends_in_its_warm_up_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train = write_jsonl(tmp_path / "train.jsonl", make_rows(200, ["pos", "neg"], seed=1))
    run = tmp_path / "run"
    args = ["train", "classification", "--train", str(train), "--out", str(run), "--preset"]
    assert main([*args, "tiny", "max_steps=10", "warmup=100", "eval_every=5"]) == 0
    out = capsys.readouterr()
    assert "within its warm-up of 100 steps" in out.out + out.err
    (warned,) = [r for r in records(run) if r["split"] == "warnings"]
    assert "warm-up" in str(warned["warnings"])
