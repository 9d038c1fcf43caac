"""The trainer on a toy task: non-finite steps, divergence, signals, resume from checkpoints."""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from qkv.cli import main
from qkv.commands import train as commands_train
from qkv.errors import CheckpointError
from qkv.training import checkpoint as ckpt
from qkv.training.config import TrainConfig
from qkv.training.trainer import Trainer, TrainingDiverged, TrainingInterrupted

CPU = torch.device("cpu")
N_BATCHES = 7  # batches per epoch; not a multiple of eval_every, so epochs and checkpoints cross


pytestmark = pytest.mark.usefixtures("one_thread")


class ToyTask:
    """Regression with a dropout MLP; `hook(call)` runs before each loss and may poison it.

    The loss of call `call` (1-based, counting every `loss` call) is multiplied by what `hook`
    returns, so NaN or inf makes a step non-finite; the hook may also send a signal.
    """

    metric = "score"

    def __init__(self, hook: Callable[[int], float] | None = None, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self._model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(N_BATCHES * 3, 4, generator=generator)  # (N, 4)
        self.y = self.x.sum(-1, keepdim=True).sin()  # (N, 1)
        self.hook = hook or (lambda call: 1.0)
        self.calls = 0

    @property
    def model(self) -> nn.Module:
        return self._model

    def batches(self, epoch: int) -> list[list[int]]:
        order = list(range(N_BATCHES))
        random.Random(epoch).shuffle(order)
        return [[3 * b, 3 * b + 1, 3 * b + 2] for b in order]

    def n_targets(self, batch: list[int]) -> int:
        return len(batch)

    def loss(self, batch: list[int], device: torch.device) -> tuple[Tensor, dict[str, float]]:
        self.calls += 1
        scale = self.hook(self.calls)
        loss = (self._model(self.x[batch]) - self.y[batch]).pow(2).sum() * scale
        return loss, {}

    def evaluate(self, device: torch.device) -> dict[str, float]:
        mse = float((self._model(self.x) - self.y).pow(2).mean())
        return {"loss": mse, "score": -mse}


def config(**changes: Any) -> TrainConfig:
    values: dict[str, Any] = {
        "lr": 1e-2,
        "warmup": 2,
        "eval_every": 3,
        "max_steps": 12,
        "max_epochs": 100,
        "keep_checkpoints": 100,
        "log_every": 1,
        "device": "cpu",
        "max_bad_steps": 3,
    }
    values.update(changes)
    return TrainConfig(**values)


def train(
    run_dir: Path, task: ToyTask | None = None, resume: bool = False, **changes: Any
) -> Trainer:
    trainer = Trainer(task or ToyTask(), config(**changes), run_dir, CPU)
    if resume:
        trainer.resume()
    trainer.train()
    return trainer


def weights(trainer: Trainer) -> dict[str, Tensor]:
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


def assert_same_weights(a: dict[str, Tensor], b: dict[str, Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


def interrupt_at(call: int, signum: signal.Signals) -> Callable[[int], float]:
    def hook(n: int) -> float:
        if n == call:
            os.kill(os.getpid(), signum)
        return 1.0

    return hook


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Trainer:
    """An uninterrupted run, to compare resumed runs with."""
    return train(tmp_path_factory.mktemp("reference"))


def test_run_writes_a_checkpoint_every_eval(reference: Trainer) -> None:
    names = [p.name for p in ckpt.list_checkpoints(reference.checkpoints)]
    assert names == [f"step-{s:07d}" for s in (3, 6, 9, 12)]
    assert [h["step"] for h in reference.progress.history] == [3, 6, 9, 12]
    assert reference.progress.step == 12 and reference.progress.done


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("call", [5, 6])  # between checkpoints; on a checkpoint step
def test_signal_saves_and_resume_is_exact(
    reference: Trainer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    signum: signal.Signals,
    call: int,
) -> None:
    with pytest.raises(TrainingInterrupted, match=rf"{signum.name} received") as error:
        train(tmp_path, ToyTask(interrupt_at(call, signum)))
    assert f"checkpoint saved at step {call}" in str(error.value)
    assert f"qkv train --resume {tmp_path}" in str(error.value)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored
    saved = ckpt.list_checkpoints(tmp_path / "checkpoints")
    assert saved[-1].name == f"step-{call:07d}"
    capsys.readouterr()

    resumed = train(tmp_path, resume=True)
    assert f"resuming from {saved[-1]}" in capsys.readouterr().out
    assert_same_weights(weights(resumed), weights(reference))
    names = [p.name for p in ckpt.list_checkpoints(tmp_path / "checkpoints")]
    assert names == [f"step-{s:07d}" for s in (3, 6, 9, 12)]  # the stop's one gone, as averages
    assert [h["step"] for h in resumed.progress.history] == [3, 6, 9, 12]
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [json.loads(x)["step"] for x in reference.log.path.read_text().splitlines()]


class SignalOnValidation(ToyTask):
    """A ToyTask that sends `signum` to itself during validation number `call`."""

    def __init__(self, call: int, signum: signal.Signals) -> None:
        super().__init__()
        self.validations, self.call, self.signum = 0, call, signum

    def evaluate(self, device: torch.device) -> dict[str, float]:
        self.validations += 1
        if self.validations == self.call:
            os.kill(os.getpid(), self.signum)
        return super().evaluate(device)


@pytest.mark.parametrize("where", ["last step", "final validation"])
def test_signal_at_the_end_saves_and_resume_finishes_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    # max_steps is no multiple of eval_every: the run ends with a validation of its own, then
    # averages its last checkpoints. An interrupt there must not lose the steps since step 9.
    settings = {"max_steps": 11, "average_last": 2}
    run = tmp_path / "run"
    for directory in (tmp_path / "reference", run):
        directory.mkdir()
    reference = train(tmp_path / "reference", **settings)
    task = ToyTask(interrupt_at(11, signal.SIGINT)) if where == "last step" else None
    with pytest.raises(TrainingInterrupted, match="checkpoint saved at step 11") as error:
        train(run, task or SignalOnValidation(4, signal.SIGINT), **settings)
    assert f"finish with: qkv train --resume {run}" in str(error.value)
    assert ckpt.list_checkpoints(run / "checkpoints")[-1].name == "step-0000011"
    capsys.readouterr()

    resumed = train(run, resume=True, **settings)
    assert "average of last 2 checkpoints" in capsys.readouterr().out
    assert_same_weights(weights(resumed), weights(reference))
    assert [h["step"] for h in resumed.progress.history] == [3, 6, 9, 11]
    assert (run / "model.safetensors").read_bytes() == (
        tmp_path / "reference" / "model.safetensors"
    ).read_bytes()


class ClosedAfter(io.StringIO):
    """A stdout whose reader goes away after `lines` writes (`qkv train | head`)."""

    def __init__(self, lines: int) -> None:
        super().__init__()
        self.lines = lines

    def write(self, text: str) -> int:
        if self.lines <= 0:
            raise BrokenPipeError(32, "Broken pipe")
        self.lines -= 1
        return super().write(text)


def test_a_closed_stdout_stops_like_a_signal_and_resume_is_exact(
    reference: Trainer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stdout = ClosedAfter(lines=6)
    monkeypatch.setattr(sys, "stdout", stdout)
    with pytest.raises(TrainingInterrupted, match=r"stdout closed: checkpoint saved at step \d"):
        train(tmp_path)
    assert sys.stdout is stdout  # the guard is gone
    monkeypatch.undo()
    resumed = train(tmp_path, resume=True)
    assert_same_weights(weights(resumed), weights(reference))


def flip_last_byte(path: Path) -> str:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    return f"{path}: checksum mismatch"


def edit_progress(path: Path, changes: dict[str, Any]) -> str:
    record = json.loads(path.read_text())
    record["progress"].update(changes)
    path.write_text(json.dumps(record))  # valid JSON: state.json has no checksum of its own
    return f"{path}: corrupt (progress."


DAMAGE: dict[str, tuple[str, Callable[[Path], str]]] = {
    "weights torn": ("model.safetensors", flip_last_byte),
    **{
        f"progress {changes}": ("state.json", lambda p, c=changes: edit_progress(p, c))
        for changes in ({"history": 5}, {"step": "x"}, {"epoch": -1}, {"steps": 3})
    },
}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_resume_skips_a_bad_newest_checkpoint(
    reference: Trainer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    damage: tuple[str, Callable[[Path], str]],
) -> None:
    with pytest.raises(TrainingInterrupted):
        train(tmp_path, ToyTask(interrupt_at(8, signal.SIGINT)))
    name, spoil = damage
    problem = spoil(tmp_path / "checkpoints" / "step-0000008" / name)
    capsys.readouterr()

    resumed = train(tmp_path, resume=True)
    out = capsys.readouterr().out
    assert f"warning: skipping bad checkpoint: {problem}" in out
    assert f"resuming from {tmp_path / 'checkpoints' / 'step-0000006'}" in out
    assert_same_weights(weights(resumed), weights(reference))


def test_averaging_leaves_out_a_bad_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(TrainingInterrupted):
        train(tmp_path, ToyTask(interrupt_at(10, signal.SIGINT)), average_last=3)
    problem = flip_last_byte(tmp_path / "checkpoints" / "step-0000009" / "model.safetensors")
    capsys.readouterr()
    resumed = train(tmp_path, resume=True, average_last=3)  # from step 10, then 12, averaged
    out = capsys.readouterr().out
    assert f"warning: not averaging a bad checkpoint: {problem}" in out
    assert "average of last 2 checkpoints" in out
    assert resumed.progress.step == 12


def test_a_signal_during_the_final_averaging_is_said_once_it_is_done(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = train(tmp_path, SignalOnValidation(5, signal.SIGINT), average_last=3)  # 3, 6, 9, 12
    assert run.progress.step == 12 and run.task.validations == 5  # type: ignore[attr-defined]
    out = capsys.readouterr().out
    assert "average of last 3 checkpoints" in out
    assert "note: SIGINT received during the final averaging, finished first" in out


def test_resume_before_the_first_checkpoint_starts_over(
    reference: Trainer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(TrainingInterrupted, match="step 2"):
        train(tmp_path, ToyTask(interrupt_at(2, signal.SIGINT)))
    for directory in ckpt.list_checkpoints(tmp_path / "checkpoints"):
        shutil.rmtree(directory)  # as if killed before any checkpoint was written
    capsys.readouterr()
    resumed = train(tmp_path, resume=True)
    assert "training from the start" in capsys.readouterr().out
    assert_same_weights(weights(resumed), weights(reference))


def test_finished_run_resumed_with_a_larger_budget_goes_on_exactly(
    reference: Trainer, tmp_path: Path
) -> None:
    assert train(tmp_path, max_steps=6).progress.done
    assert train(tmp_path, resume=True, max_steps=6).progress.step == 6  # nothing left to do
    resumed = train(tmp_path, resume=True)
    assert resumed.progress.step == 12
    assert_same_weights(weights(resumed), weights(reference))


def test_a_budget_already_passed_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train(tmp_path, max_steps=6)
    capsys.readouterr()
    assert train(tmp_path, resume=True, max_steps=3).progress.step == 6
    said = "note: the run has spent max_steps=3 (at 6 steps): no training (raise it to train on)"
    assert said in capsys.readouterr().out
    # A run that ended on its time: a larger max_steps alone does not train on, and says why.
    assert train(tmp_path, resume=True, max_steps=9, max_minutes=1e-9).progress.step == 6
    assert "spent max_minutes=1e-09 (at 0.0 minutes)" in capsys.readouterr().out
    assert train(tmp_path, resume=True, max_steps=9).progress.step == 9


def test_a_resumed_run_takes_its_new_optimiser_settings(tmp_path: Path) -> None:
    train(tmp_path, max_steps=6)
    resumed = Trainer(ToyTask(), config(beta1=0.5, beta2=0.7, weight_decay=0.25), tmp_path, CPU)
    resumed.resume()
    (group,) = resumed.optimizer.param_groups
    assert group["betas"] == (0.5, 0.7) and group["weight_decay"] == 0.25
    assert resumed.progress.step == 6  # the rest of the state is the checkpoint's


def test_without_a_terminal_progress_is_printed_as_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train(tmp_path, max_steps=4, log_every=2)
    out = capsys.readouterr().out
    assert "training 97 parameters on cpu from step 0" in out
    assert [line.split(":")[0] for line in out.splitlines() if " train: " in line] == [
        "step 1 train",
        "step 2 train",
        "step 4 train",
    ]


def test_early_stopped_run_stays_stopped(tmp_path: Path) -> None:
    class NeverBetter(ToyTask):
        def evaluate(self, device: torch.device) -> dict[str, float]:
            return {"loss": 1.0, "score": 0.0}

    stopped = train(tmp_path, NeverBetter(), patience=2)
    assert stopped.progress.done and stopped.progress.step == 9  # best at 3; 6, 9 no better
    assert train(tmp_path, resume=True, patience=2).progress.step == 9


@pytest.mark.parametrize("damage", ["deleted", "corrupt"])
def test_a_finished_run_resumed_without_its_best_weights_writes_them_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    finished = train(tmp_path)
    best = tmp_path / "model.safetensors"
    if damage == "deleted":
        best.unlink()
    else:
        data = bytearray(best.read_bytes())
        data[-3] ^= 0xFF  # a flipped bit in the last tensor
        best.write_bytes(bytes(data))
    capsys.readouterr()
    resumed = train(tmp_path, resume=True)
    said = "model.safetensors is missing" if damage == "deleted" else "checksum mismatch"
    assert said in capsys.readouterr().out
    assert resumed.progress.step == finished.progress.step == 12
    assert resumed.progress.best == resumed.progress.history[-1]["score"]
    written = ToyTask().model
    ckpt.load_weights(written, tmp_path / "model.safetensors")  # the last step's weights
    assert_same_weights(written.state_dict(), weights(finished))
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "valid"] == [3, 6, 9, 12, 12]


def test_resume_refuses_when_weights_exist_but_no_checkpoint(tmp_path: Path) -> None:
    train(tmp_path, max_steps=3)
    for directory in ckpt.list_checkpoints(tmp_path / "checkpoints"):
        shutil.rmtree(directory)
    with pytest.raises(CheckpointError, match="no complete checkpoint to resume from"):
        train(tmp_path, resume=True)


def test_resume_refuses_when_every_checkpoint_is_bad(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train(tmp_path, max_steps=6)
    for directory in ckpt.list_checkpoints(tmp_path / "checkpoints"):
        (directory / "optimizer.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        train(tmp_path, resume=True)
    out = capsys.readouterr().out
    assert out.count("warning: skipping bad checkpoint") == 2
    assert "step-0000003/optimizer.safetensors: checksum mismatch" in out


def test_non_finite_steps_are_skipped_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad_calls = {4, 7, 8}  # call 4 comes right after step 3, which was validated
    task = ToyTask(lambda n: float("nan") if n in bad_calls else 1.0)
    trainer = train(tmp_path, task)
    p = trainer.progress
    assert (p.step, p.skipped_steps, p.bad_steps) == (12, 3, 0)
    assert task.calls == 12 + 3
    assert int(trainer.optimizer.state_dict()["state"][0]["step"]) == 12  # Adam never saw them
    out = capsys.readouterr().out
    assert out.count("non-finite loss or gradient") == 3
    assert "at step 4; batch skipped" in out
    assert [h["step"] for h in p.history] == [3, 6, 9, 12]  # no second validation of step 3
    assert all(torch.isfinite(w).all() for w in trainer.model.state_dict().values())


def test_non_finite_gradient_is_caught_with_clipping_off(tmp_path: Path) -> None:
    class InfiniteGradient(ToyTask):
        def loss(self, batch: list[int], device: torch.device) -> tuple[Tensor, dict[str, float]]:
            loss, extra = super().loss(batch, device)
            if self.calls == 2:
                weight = self._model[0].weight
                loss = loss + torch.sqrt(weight.sum() * 0)  # value 0, gradient inf * 0 = nan
            return loss, extra

    trainer = train(tmp_path, InfiniteGradient(), clip_norm=0.0, max_steps=4)
    assert trainer.progress.skipped_steps == 1
    assert all(torch.isfinite(w).all() for w in trainer.model.state_dict().values())


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_divergence_stops_and_keeps_the_last_good_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], poison: float
) -> None:
    task = ToyTask(lambda n: poison if n > 7 else 1.0)
    with pytest.raises(TrainingDiverged) as error:
        train(tmp_path, task)
    good = tmp_path / "checkpoints" / "step-0000006"
    message = str(error.value)
    assert message.startswith("3 non-finite batches in a row at step 8: stopping.")
    assert f"Last good checkpoint: {good}" in message
    assert "\n" not in message
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "checkpoints")] == [
        "step-0000003",
        "step-0000006",
    ]
    assert ckpt.verify_checkpoint(good)["progress"]["bad_steps"] == 0
    assert capsys.readouterr().out.count("batch skipped") == 3

    resumed = train(tmp_path, ToyTask(), resume=True)  # e.g. after lowering the lr
    assert resumed.progress.step == 12


class ScriptedScores(ToyTask):
    """A ToyTask whose validations score as scripted, in order (averages included)."""

    def __init__(self, scores: list[float]) -> None:
        super().__init__()
        self.scores = list(scores)

    def evaluate(self, device: torch.device) -> dict[str, float]:
        return {"loss": 0.0, "score": self.scores.pop(0)}


def test_a_better_average_is_remembered_across_resumes(tmp_path: Path) -> None:
    first = train(tmp_path, ScriptedScores([1.0, 2.0, 5.0]), max_steps=6, average_last=2)
    assert (first.progress.best, first.progress.best_step) == (5.0, 6)
    progress = ckpt.verify_checkpoint(tmp_path / "checkpoints" / "step-0000006")["progress"]
    assert (progress["best"], progress["best_step"]) == (5.0, 6)
    averaged = (tmp_path / "model.safetensors").read_bytes()
    # Resumed: a single checkpoint (3.0) and a new average (4.0), both worse than 5.0.
    second = train(tmp_path, ScriptedScores([3.0, 4.0]), resume=True, max_steps=9, average_last=2)
    assert (second.progress.best, second.progress.best_step) == (5.0, 6)
    assert (tmp_path / "model.safetensors").read_bytes() == averaged


def test_divergence_before_any_checkpoint_says_none(tmp_path: Path) -> None:
    task = ToyTask(lambda n: float("nan"))
    with pytest.raises(TrainingDiverged, match=r"at step 1: stopping\. Last good checkpoint: none"):
        train(tmp_path, task)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (TrainingDiverged("3 non-finite batches in a row at step 8: stopping."), 2),
        (
            TrainingInterrupted("SIGTERM received: checkpoint saved at step 5; continue with: x"),
            130,
        ),
    ],
)
def test_command_line_exit_codes(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    error: Exception,
    code: int,
) -> None:
    def stop(args: object) -> int:
        raise error

    monkeypatch.setattr(commands_train, "run", stop)
    assert main(["train", "--resume", "RUN"]) == code
    captured = capsys.readouterr()
    assert captured.err == f"qkv: {error}\n"
