"""`fast=false` trains the reference model; its losses are the fast model's up to rounding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qkv.cli import main
from qkv.run import RunConfig
from tests.tasks.helpers import write_dates

STEPS = 6
SETTINGS = [  # no dropout: the fast path draws its masks differently
    "--preset",
    "tiny",
    "vocab_size=120",
    "dropout=0",
    f"max_steps={STEPS}",
    f"eval_every={STEPS}",
    "log_every=1",
    "threads=2",
]


def train_losses(run: Path) -> list[float]:
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r["split"] == "train"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dates(tmp_path_factory.mktemp("dates"), train=200, val=20)


def test_fast_false_trains_the_reference_model_to_the_same_losses(
    corpus: Path, tmp_path: Path
) -> None:
    losses = {}
    for fast in ("true", "false"):
        run = tmp_path / fast
        data = ["--data", str(corpus), "--src", "src", "--tgt", "tgt", "--out", str(run)]
        assert main(["train", "translation", *data, *SETTINGS, f"fast={fast}"]) == 0
        assert RunConfig.load(run).train.fast is (fast == "true")
        losses[fast] = train_losses(run)
    assert len(losses["true"]) == STEPS
    assert losses["false"] == pytest.approx(losses["true"], rel=1e-4)
    assert main(["train", "--resume", str(tmp_path / "false"), f"max_steps={STEPS + 2}"]) == 0
    assert RunConfig.load(tmp_path / "false").train.fast is False  # resume keeps the switch
