"""`qkv demo`: a shortened demo end to end, its data, its printout and its errors."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib import image as mpimg

from qkv.cli import main
from qkv.commands import demo as demo_command
from qkv.errors import ConfigError
from qkv.tasks.demo import DemoExample, DemoResult, check_out, make_demo_data, run_demo

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")

_shortened: dict[str, DemoResult] = {}


def shortened_demo(tmp_path_factory: pytest.TempPathFactory) -> DemoResult:
    """A demo of a few seconds on a few thousand dates, run once per test session."""
    if "result" not in _shortened:
        threads = torch.get_num_threads()
        try:
            _shortened["result"] = run_demo(
                tmp_path_factory.mktemp("demo"),
                minutes=0.08,
                seed=3,
                n_train=2000,
                n_valid=30,
                n_test=40,
                n_examples=5,
                eval_every=25,
                echo=lambda _line: None,
            )
        finally:
            torch.set_num_threads(threads)  # training sets its own count for the process
    return _shortened["result"]


@pytest.fixture(scope="session")
def demo_result(tmp_path_factory: pytest.TempPathFactory) -> DemoResult:
    return shortened_demo(tmp_path_factory)


def readable_png(path: Path) -> np.ndarray:
    assert path.read_bytes()[:8] == PNG_MAGIC
    pixels = mpimg.imread(path)
    assert pixels.std() > 0.05  # drawn on, not a blank canvas
    return pixels


def test_shortened_demo_writes_data_run_and_pictures(demo_result: DemoResult) -> None:
    paths = demo_result.paths
    assert isinstance(demo_result.accuracy, float)
    assert 0.0 <= demo_result.accuracy <= 1.0
    assert len(demo_result.examples) == 5
    for example in demo_result.examples:
        assert ISO_DATE.fullmatch(example.reference)
        assert example.correct == (example.output == example.reference)
    for split, count in (("train", 2000), ("val", 30), ("test", 40)):
        for side in ("src", "tgt"):
            lines = (paths["data"] / f"{split}.{side}").read_text(encoding="utf-8").splitlines()
            assert len(lines) == count
    run = paths["run"]
    for name in ("config.json", "tokenizer.json", "model.safetensors", "metrics.jsonl"):
        assert (run / name).is_file()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(r["split"] == "valid" for r in records)
    assert paths["attention"] == run.parent / "attention.png"
    assert paths["curves"] == run.parent / "curves.png"
    height, width = readable_png(paths["attention"]).shape[:2]
    assert height > 600 and width > 600  # a grid of panels: cross of 2 layers, then self
    readable_png(paths["curves"])


def test_held_out_dates_are_not_in_the_training_set(tmp_path: Path) -> None:
    test = make_demo_data(tmp_path, seed=5, n_train=300, n_valid=20, n_test=20)
    train_sources = set((tmp_path / "train.src").read_text(encoding="utf-8").splitlines())
    valid_sources = (tmp_path / "val.src").read_text(encoding="utf-8").splitlines()
    assert len(test) == 20
    assert not train_sources & {source for source, _ in test}
    assert not train_sources & set(valid_sources)
    targets = (tmp_path / "test.tgt").read_text(encoding="utf-8").splitlines()
    assert targets == [target for _, target in test]


def test_a_directory_that_is_not_a_run_is_never_removed(tmp_path: Path) -> None:
    keep = tmp_path / "run" / "notes.txt"
    keep.parent.mkdir()
    keep.write_text("mine", encoding="utf-8")
    with pytest.raises(ConfigError, match="run/, not a demo's run"):
        run_demo(tmp_path, minutes=0.01, echo=lambda _line: None)
    assert keep.read_text(encoding="utf-8") == "mine"


def test_only_an_earlier_demo_is_replaced(demo_result: DemoResult, tmp_path: Path) -> None:
    shutil.copytree(demo_result.paths["run"].parent, tmp_path / "demo")
    check_out(tmp_path / "demo")  # a demo's own directory, moved: its run is replaced
    check_out(tmp_path / "new")
    (tmp_path / "empty" / "run").mkdir(parents=True)
    check_out(tmp_path / "empty")

    other = tmp_path / "other"  # another model, in a directory named run
    shutil.copytree(demo_result.paths["run"], other / "run")
    config = json.loads((other / "run" / "config.json").read_text(encoding="utf-8"))
    config["model"]["d_ff"] *= 2
    (other / "run" / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"\(run/, not a demo's run\)"):
        check_out(other)
    shutil.rmtree(other / "run")
    (other / "data").mkdir()
    (other / "data" / "corpus.de").write_text("mine", encoding="utf-8")
    (other / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"\(notes.txt, data/corpus.de\); give a new or empty"):
        run_demo(other, minutes=0.01, echo=lambda _line: None)
    assert (other / "notes.txt").read_text(encoding="utf-8") == "mine"
    assert sorted(path.name for path in (other / "data").iterdir()) == ["corpus.de"]


def test_an_empty_out_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="--out is empty"):
        run_demo("", minutes=0.01, echo=lambda _line: None)
    assert list(tmp_path.iterdir()) == []


def test_an_out_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("mine", encoding="utf-8")
    with pytest.raises(ConfigError, match="is a file; the demo writes into a directory"):
        run_demo(tmp_path / "file", minutes=0.01, echo=lambda _line: None)
    assert (tmp_path / "file").read_text(encoding="utf-8") == "mine"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"minutes": 0.0}, "positive, finite time budget"),
        ({"minutes": float("nan")}, "positive, finite time budget"),
        ({"minutes": float("inf")}, "positive, finite time budget"),
        ({"n_test": 0}, "at least one"),
    ],
)
def test_bad_sizes_are_config_errors(
    tmp_path: Path, options: dict[str, float], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        run_demo(tmp_path, echo=lambda _line: None, **options)
    assert not (tmp_path / "data").exists()


def test_cli_prints_examples_accuracy_and_paths(
    demo_result: DemoResult, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: dict[str, object] = {}

    def fake_run_demo(out: str, minutes: float, seed: int) -> DemoResult:
        seen.update(out=out, minutes=minutes, seed=seed)
        return demo_result

    monkeypatch.setattr(demo_command, "run_demo", fake_run_demo)
    assert main(["demo", "--out", "somewhere", "--minutes", "0.5", "--seed", "7"]) == 0
    assert seen == {"out": "somewhere", "minutes": 0.5, "seed": 7}
    printed = capsys.readouterr().out
    for example in demo_result.examples:
        assert example.source in printed
    assert f"{demo_result.accuracy:.1%}" in printed
    assert str(demo_result.paths["attention"]) in printed
    assert str(demo_result.paths["curves"]) in printed


def test_printout_marks_right_and_wrong(capsys: pytest.CaptureFixture[str]) -> None:
    result = DemoResult(
        accuracy=0.5,
        examples=[
            DemoExample("3 March 2021", "2021-03-03", "2021-03-03"),
            DemoExample("Mar 4 2021", "2021-03-04", "2021-04-03"),
        ],
        paths={name: Path(name) for name in ("data", "run", "attention", "curves")},
    )
    demo_command.print_result(result, seconds=61.0)
    lines = capsys.readouterr().out.splitlines()
    assert any(line.strip().endswith("2021-03-03  ✓") for line in lines)
    assert any("2021-04-03  ✗ (expected 2021-03-04)" in line for line in lines)
    assert "exact-match accuracy on held-out dates: 50.0%" in lines


def test_cli_reports_a_bad_budget_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--out", str(tmp_path), "--minutes", "0"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "positive, finite time budget" in error


def test_a_demo_stopped_before_its_run_is_saved_does_not_stand_in_the_next_one_s_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qkv.tasks import translation

    def stopped(data: object, model: object, training: object, run_dir: Path) -> None:
        run_dir.mkdir(parents=True)
        (run_dir / "tokenizer.json").write_text("{}")  # what a run makes first
        raise KeyboardInterrupt  # Ctrl-C, before the run saved its settings

    monkeypatch.setattr(translation, "train_translation", stopped)
    with pytest.raises(KeyboardInterrupt):
        run_demo(tmp_path / "demo", n_train=20, n_valid=5, n_test=5)
    assert not (tmp_path / "demo" / "run").exists()
    left = tmp_path / "killed" / "run"  # SIGKILL: nothing could clean up
    (left / "cache").mkdir(parents=True)
    (left / "tokenizer.json").write_text("{}")
    check_out(tmp_path / "killed")  # a demo may replace it
