"""The training step that a GPU records as a CUDA graph, run eagerly on the CPU: the same
updates as the trainer's own step, and no update where the loss is not finite."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from qkv.cli import main
from qkv.model.seq2seq import Seq2SeqTransformer
from qkv.tasks.translation import TranslationTask
from qkv.training.config import TrainConfig
from qkv.training.graphed import GraphedStep
from qkv.training.optimizer import adamw
from qkv.training.trainer import Trainer
from tests.model.helpers import tiny_config
from tests.tasks.helpers import write_dates

CPU = torch.device("cpu")


def _sentences(seed: int, count: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 12, (count,), generator=generator)
    return [torch.randint(5, 40, (int(n),), generator=generator).tolist() for n in lengths]


def _task(seed: int = 0) -> TranslationTask:
    torch.manual_seed(seed)
    model = Seq2SeqTransformer(tiny_config(norm_first=seed % 2 == 1))
    corpora = {
        "train.src": _sentences(1, 40),
        "train.tgt": _sentences(2, 40),
        "valid.src": [],
        "valid.tgt": [],
    }
    return TranslationTask(model, None, corpora, [], TrainConfig())  # type: ignore[arg-type]


BATCHES = [list(range(0, 7)), list(range(7, 25)), list(range(25, 30)), list(range(30, 40))]


@pytest.mark.parametrize("seed", [0, 1])
def test_padded_loss_is_the_packed_loss(seed: int) -> None:
    task = _task(seed)
    for batch in BATCHES:
        inputs = task.padded_inputs(batch, CPU)
        assert inputs["src"].size(0) % 16 == 0 and inputs["tgt_in"].size(1) % 8 == 0
        assert inputs["rows"].shape == inputs["labels"].shape and inputs["rows"].numel() % 256 == 0
        loss, count = task.padded_loss(inputs)
        expected, _ = task.loss(batch, CPU)
        assert int(count) == task.n_targets(batch)
        torch.testing.assert_close(loss, expected, atol=1e-4, rtol=1e-5)


def test_graphed_step_makes_the_trainers_updates() -> None:
    """The trainer's eager step (packed batch, lr set, loss / targets, clipping, AdamW) and the
    graphed step's body, from the same weights over the same batches."""
    eager_task, graphed_task = _task(), _task()
    params = list(eager_task.model.parameters())
    eager_opt = adamw(params, CPU, lr=1e-3, betas=(0.9, 0.98))
    graphed_opt = adamw(graphed_task.model.parameters(), CPU, lr=1e-3, betas=(0.9, 0.98))
    step = GraphedStep(graphed_task.model, graphed_opt, graphed_task.padded_loss, max_norm=0.5)
    for lr, batch in zip([1e-3, 3e-3, 2e-3, 5e-4], BATCHES, strict=True):
        for group in eager_opt.param_groups:
            group["lr"] = lr
        loss, _ = eager_task.loss(batch, CPU)
        (loss / eager_task.n_targets(batch)).backward()
        norm = torch.nn.utils.clip_grad_norm_(params, 0.5)
        eager_opt.step()
        eager_opt.zero_grad(set_to_none=True)
        found_loss, found_norm = step.step(graphed_task.padded_inputs(batch, CPU), lr)
        torch.testing.assert_close(found_loss, loss.detach(), atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(found_norm, norm, atol=1e-5, rtol=1e-4)
        assert float(step.found_inf) == 0.0
    # Compared through the outputs: the key projection's bias has a gradient of zero up to
    # rounding (softmax ignores a constant added to every score), which Adam's normalisation
    # turns into steps of either sign; the outputs do not depend on it.
    src, tgt_in = (graphed_task.padded_inputs(BATCHES[1], CPU)[k] for k in ("src", "tgt_in"))
    torch.testing.assert_close(
        graphed_task.model(src, tgt_in), eager_task.model(src, tgt_in), atol=1e-4, rtol=1e-4
    )
    assert graphed_opt.state_dict()["state"][0]["step"] == 4


def test_a_non_finite_loss_leaves_weights_and_optimizer_state_alone() -> None:
    task = _task()
    optimizer = adamw(task.model.parameters(), CPU, lr=1e-3, betas=(0.9, 0.98))
    poison = {"factor": 1.0}

    def loss(inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        total, count = task.padded_loss(inputs)
        return total * poison["factor"], count

    step = GraphedStep(task.model, optimizer, loss)
    step.step(task.padded_inputs(BATCHES[0], CPU), 1e-3)
    before = [p.detach().clone() for p in task.model.parameters()]
    moments = optimizer.state_dict()["state"][0]["exp_avg"].clone()
    poison["factor"] = math.nan
    found_loss, _ = step.step(task.padded_inputs(BATCHES[1], CPU), 1e-3)
    assert math.isnan(float(found_loss)) and float(step.found_inf) == 1.0
    for after, expected in zip(task.model.parameters(), before, strict=True):
        assert torch.equal(after, expected)
    state = optimizer.state_dict()["state"][0]
    assert state["step"] == 1 and torch.equal(state["exp_avg"], moments)
    poison["factor"] = 1.0
    step.step(task.padded_inputs(BATCHES[2], CPU), 1e-3)
    assert optimizer.state_dict()["state"][0]["step"] == 2
    assert not all(torch.equal(a, b) for a, b in zip(task.model.parameters(), before, strict=True))


def test_needs_a_fused_optimizer() -> None:
    task = _task()
    plain = torch.optim.AdamW(task.model.parameters(), lr=1e-3, foreach=True)
    with pytest.raises(ValueError, match="fused"):
        GraphedStep(task.model, plain, task.padded_loss)


def test_a_trainer_run_through_the_graphed_step_trains_as_the_eager_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer's GPU branch (lr schedule, clipping, bad-step check, checkpoints), with the
    graphed step run eagerly on the CPU: the same losses as the trainer's own eager step."""
    data = write_dates(tmp_path / "data", train=200, val=10)
    argv = ["train", "translation", "--data", str(data), "--src", "src", "--tgt", "tgt"]
    argv += ["--preset", "tiny", "vocab_size=120", "max_steps=12", "eval_every=6", "log_every=1"]
    argv += ["dropout=0", "warmup=4", "lr=3e-3", "max_tokens=400", "threads=1"]
    made: list[GraphedStep] = []

    def graphed_step(self: Trainer, max_norm: float) -> GraphedStep:
        if self.graphed is None:
            self.graphed = GraphedStep(self.model, self.optimizer, self.task.padded_loss, max_norm)  # type: ignore[attr-defined]
            made.append(self.graphed)
        return self.graphed

    losses = {}
    for name in ("eager", "graphed"):
        if name == "graphed":
            monkeypatch.setattr(Trainer, "graphed_step", graphed_step)
        run = tmp_path / name
        assert main([*argv, "--out", str(run)]) == 0
        records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        losses[name] = [r["loss"] for r in records if r["split"] == "train"]
    assert len(made) == 1 and len(losses["graphed"]) == 12
    assert losses["graphed"] == pytest.approx(losses["eager"], rel=2e-3)
    assert losses["graphed"][-1] < losses["graphed"][0]
