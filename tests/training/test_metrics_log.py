import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from qkv.training.metrics_log import MetricsLog


def test_jsonl_and_tensorboard_mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scalars: list[tuple[str, float, int]] = []

    class FakeWriter:
        def __init__(self, logdir: str) -> None:
            assert logdir.endswith("tensorboard")

        def add_scalar(self, tag: str, value: float, step: int) -> None:
            scalars.append((tag, value, step))

        def flush(self) -> None:
            pass

    fake: Any = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = FakeWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"split": "valid", "step": 10, "epoch": 1, "loss": 2.5, "bleu": 30.0})
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["bleu"] == 30.0
    assert scalars == [("valid/loss", 2.5, 10), ("valid/bleu", 30.0, 10)]


def test_without_tensorboard_only_jsonl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"split": "train", "step": 1, "loss": 1.0})
    log.write({"split": "train", "step": 2, "loss": 0.5})
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2
    assert not (tmp_path / "tensorboard").exists()


def test_only_the_main_process_writes_or_truncates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for step in (1, 2, 3):
        log.write({"split": "train", "step": step, "loss": 1.0})
    before = log.path.read_text()
    monkeypatch.setattr("qkv.training.metrics_log.is_main", lambda: False)
    log.write({"split": "train", "step": 4, "loss": 1.0})
    log.truncate_after(0)  # every rank resuming a run calls it; rank 0 alone acts
    assert log.path.read_text() == before
    monkeypatch.undo()
    log.truncate_after(2)
    assert [json.loads(line)["step"] for line in log.path.read_text().splitlines()] == [1, 2]


def test_truncation_drops_the_warnings_a_run_end_writes_again(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"split": "valid", "step": 5, "bleu": 1.0})
    log.write({"split": "warnings", "step": 5, "warnings": ["the run ended within warm-up"]})
    log.truncate_after(5)  # a finished run resumed: its end warns again if it still should
    assert [json.loads(line)["split"] for line in log.path.read_text().splitlines()] == ["valid"]
