"""One trainer for every task: steps, validation, logging, checkpoints, resume, signals."""

from __future__ import annotations

import contextlib
import math
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from qkv import fast
from qkv.errors import CheckpointError, ConfigError, QkvError
from qkv.fits import typed_section
from qkv.training import checkpoint as ckpt
from qkv.training import distributed
from qkv.training.config import TrainConfig
from qkv.training.graphed import GraphedStep
from qkv.training.metrics_log import MetricsLog
from qkv.training.optimizer import adamw
from qkv.training.signals import stop_signals
from qkv.training.task import GraphableTask, TrainingTask
from qkv.training.verdict import run_warnings


class TrainingInterrupted(QkvError):
    """Training stopped on SIGINT/SIGTERM, or its stdout closed, after saving a checkpoint."""


class TrainingDiverged(QkvError):
    """Training stopped after too many non-finite steps in a row."""


@dataclass
class Progress:
    """Where training is; saved in every checkpoint."""

    step: int = 0  # optimiser steps done
    epoch: int = 0  # current epoch
    batch_index: int = 0  # next batch of the current epoch
    best: float = -math.inf  # best validation metric so far
    best_step: int = 0
    evals_since_best: int = 0
    elapsed: float = 0.0  # training seconds, validation excluded
    bad_steps: int = 0  # non-finite steps in a row
    skipped_steps: int = 0  # non-finite steps in all
    done: bool = False
    world_size: int = 1  # processes training together (torchrun), each on its own batches
    history: list[dict[str, float]] = field(default_factory=list)


def weights_problem(path: Path) -> str | None:
    """What is wrong with a run's best weights (deleted, torn, corrupt), if anything; read on
    rank 0 only."""
    if not distributed.is_main():
        return None
    if not path.exists():
        return f"{path} is missing"
    try:
        ckpt.read_weights(path)
    except CheckpointError as error:
        return str(error)
    return None


def check_progress(directory: Path, record: dict[str, Any]) -> None:
    """Refuse a checkpoint whose progress does not fit `Progress` (state.json has no
    checksum of its own: edited by hand, say)."""
    try:
        progress = typed_section(record.get("progress"), Progress, "progress")
        if unknown := sorted(set(progress) - {f.name for f in fields(Progress)}):
            raise ConfigError(f"progress.{unknown[0]} is unknown")
        for key, least in MINIMA.items():
            if isinstance(progress.get(key), int) and progress[key] < least:
                raise ConfigError(f"progress.{key} is {progress[key]}, below {least}")
    except ConfigError as error:
        raise CheckpointError(f"{directory / ckpt.STATE_FILE}: corrupt ({error})") from None


MINIMA = {"step": 0, "epoch": 0, "batch_index": 0, "best_step": 0, "world_size": 1}


class Trainer:
    """Trains `task.model` into `run_dir`, resuming from its newest good checkpoint if asked."""

    def __init__(
        self, task: TrainingTask, config: TrainConfig, run_dir: Path, device: torch.device
    ):
        self.task, self.config, self.run_dir, self.device = task, config, run_dir, device
        self.model = task.model.to(device)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        betas = (config.beta1, config.beta2)
        self.optimizer = adamw(
            trainable, device, config.lr, betas, weight_decay=config.weight_decay
        )
        self.graphed: GraphedStep | None = None  # made at the first step, after any resume
        # Under torchrun: the loss through DistributedDataParallel, which averages gradients.
        self.world, self.rank = distributed.world_size(), distributed.rank()
        self.ddp = distributed.data_parallel(task, device) if self.world > 1 else None
        if self.rank > 0:  # dropout of its own on each rank (the weights came from rank 0)
            torch.manual_seed(config.seed + self.rank)
        self.progress = Progress(world_size=self.world)
        self.steps_per_epoch = 1  # known once the first epoch's batches are made
        self.plan = ""  # the line of a new run's plan (`plan.py`), printed as training starts
        self.log = MetricsLog(run_dir / "metrics.jsonl")
        self.checkpoints = run_dir / "checkpoints"

    def checkpoint_at(self, step: int) -> Path:
        return self.checkpoints / f"step-{step:07d}"

    def save(self) -> None:
        """A checkpoint of the step, written by rank 0 while the others wait for it."""
        rng = distributed.rng_states()
        if distributed.is_main():
            directory = self.checkpoint_at(self.progress.step)
            state = {"progress": vars(self.progress)}
            ckpt.save_checkpoint(directory, self.model, self.optimizer, state, rng)
            validated = {self.checkpoint_at(int(r["step"])) for r in self.progress.history}
            if directory in validated:  # a stop's checkpoint was to resume from: resumed past it
                for stop in set(ckpt.list_checkpoints(self.checkpoints)) - validated:
                    shutil.rmtree(stop, ignore_errors=True)
            ckpt.prune_checkpoints(
                self.checkpoints, max(self.config.keep_checkpoints, self.config.average_last)
            )
        distributed.barrier()  # no rank ends (on a signal, say) before the checkpoint is written

    def resume(self) -> None:
        """Continue from the newest checkpoint that verifies, reporting any bad newer ones."""
        directory, problems = ckpt.latest_good_checkpoint(self.checkpoints, check_progress)
        for problem in problems:
            print(f"warning: skipping bad checkpoint: {problem}")
        weights = self.run_dir / "model.safetensors"
        if directory is None and not problems and not weights.exists():
            # Stopped before the first validation: nothing to lose, start again from step 0.
            print(f"no checkpoint in {self.checkpoints} yet: training from the start")
            self.log.truncate_after(0)
            return
        if directory is None:
            message = f"{self.checkpoints}: no complete checkpoint to resume from"
            if not problems:
                message += (
                    f"; {weights} holds the best weights so far (the ones the run is used with): "
                    "to train again from step 0, move it away and resume again"
                )
            raise CheckpointError(message)
        record, rng = ckpt.load_checkpoint(directory, self.model, self.optimizer)
        for group in self.optimizer.param_groups:  # settings a resumed run may change
            group["betas"] = (self.config.beta1, self.config.beta2)
            group["weight_decay"] = self.config.weight_decay
        try:
            self.progress = Progress(**record["progress"])
            distributed.restore_rng(rng, self.config.seed)
        except (KeyError, TypeError, RuntimeError) as error:
            raise CheckpointError(f"{directory}: training state unreadable ({error})") from None
        # A run that stopped on its budget goes on when resumed with a larger one.
        c, p = self.config, self.progress
        damaged: str | None = distributed.from_main(weights_problem(weights))  # since?
        if p.history and damaged:
            print(
                f"warning: {damaged}: its score ({p.best:.4g}) is forgotten, and the next "
                "validation writes the weights again"
            )
            p.best, p.evals_since_best = -math.inf, 0
        p.done = bool(spent := self.spent())
        if spent:
            print(f"note: the run has spent {spent}: no training (raise it to train on)")
        if (was := p.world_size) != (now := self.world):  # a note on what changes
            print(
                f"note: the checkpoint was trained by {was} process(es), this run has {now}: a "
                f"step now takes {c.accumulate * now} batches (was {c.accumulate * was}), so the "
                f"effective batch is {now / was:.3g} times what it was and an epoch has "
                f"{was / now:.3g} times the steps; the data order and the learning-rate schedule "
                "(by steps) stay"
            )
            p.world_size = now
        self.log.truncate_after(self.progress.step)
        print(f"resuming from {directory} (step {self.progress.step}, epoch {self.progress.epoch})")

    def train(self) -> Progress:
        """Run until max_epochs / max_steps / max_minutes / early stopping."""
        c, p = self.config, self.progress
        parameters = sum(t.numel() for t in self.model.parameters() if t.requires_grad)
        with stop_signals() as received:
            where = f"{self.device}" if self.world == 1 else f"{self.world} processes"
            print(f"training {parameters:,} parameters on {where} from step {p.step}")
            if self.plan:
                print(self.plan)
            bar = tqdm(
                total=c.max_steps or None,
                initial=p.step,
                unit="step",
                disable=None if distributed.is_main() else True,
                dynamic_ncols=True,
            )
            # Every rank makes the same batches; a step takes `per_step` of them (`shard`).
            per_step = c.accumulate * self.world
            while not p.done and p.epoch < c.max_epochs:
                batches = self.task.batches(p.epoch)
                self.steps_per_epoch = max(1, len(batches) // per_step)
                while p.batch_index < len(batches):
                    group = batches[p.batch_index : p.batch_index + per_step]
                    stepped = self.step(group, bar)
                    p.batch_index += len(group)
                    stop = self.agree(received)
                    if stepped and self.spent():
                        p.done = True
                        break
                    # A skipped step leaves p.step unchanged: no second validation of it.
                    if stepped and p.step % c.eval_every == 0:
                        self.validate()  # and a checkpoint
                        stop = self.agree(received)
                        if p.done:
                            break
                    elif stop:
                        self.save()
                    if stop:
                        raise self.interrupted(stop, "continue")
                if not p.done:
                    p.epoch, p.batch_index = p.epoch + 1, 0
            bar.close()
            # A finished run resumed without its best weights validates once more to write them.
            unvalidated = not p.history or p.history[-1]["step"] != p.step or p.best == -math.inf
            stop = self.agree(received)
            if stop and unvalidated:  # during the last step: its checkpoint, no validation
                self.save()
            elif unvalidated:
                self.validate()
                stop = self.agree(received)
            if stop:  # before or during the final validation: the averaging is left to do
                raise self.interrupted(stop, "finish")
            self.finish()
            if received:  # the run is whole: nothing is left to resume
                tqdm.write(f"note: {received[0]} during the final averaging, finished first")
            self.report_waste()
        return p

    def report_waste(self) -> None:
        """Say plainly, and record in the metrics, the signs of a wasted run (`verdict.py`)."""
        c, p = self.config, self.progress
        valid = [{"split": "valid", **record} for record in p.history]
        records = [{"split": "train", "step": p.step}, *valid]
        trivial = getattr(self.task, "trivial", 0.0)
        found = run_warnings(records, c.warmup, self.task.metric, trivial, p.skipped_steps)
        for warning in found:
            tqdm.write(f"warning: {warning}")
        if found:
            self.log.write({"split": "warnings", "step": p.step, "warnings": found})

    def interrupted(self, reason: str, then: str) -> TrainingInterrupted:
        """The error that ends a run stopped for `reason`, its checkpoint saved."""
        launcher = "torchrun ... -m " if self.world > 1 else ""  # with its options again
        return TrainingInterrupted(
            f"{reason}: checkpoint saved at step {self.progress.step}; "
            f"{then} with: {launcher}qkv train --resume {self.run_dir}"
        )

    def agree(self, received: list[str]) -> str | None:
        """Why to stop now, the same on every rank: a signal that any rank received (else
        None). Under torchrun, the ranks also take the slowest one's training time, so that
        `max_minutes` ends them all at the same step."""
        reason, self.progress.elapsed = distributed.agree_stop(received, self.progress.elapsed)
        return reason

    def spent(self) -> str | None:
        """Which of its budgets the run has spent, if any (a resumed run may have already)."""
        c, p = self.config, self.progress
        if c.patience and p.evals_since_best >= c.patience:
            return f"its patience={c.patience} (validations without a better score)"
        return next(
            (
                f"max_{name}={limit:g} (at {shown} {name})"
                for name, limit, value, shown in (
                    ("steps", c.max_steps, p.step, f"{p.step}"),
                    ("minutes", c.max_minutes, p.elapsed / 60, f"{p.elapsed / 60:.1f}"),
                    ("epochs", c.max_epochs, p.epoch, f"{p.epoch}"),
                )
                if limit and value >= limit
            ),
            None,
        )

    def learning_rate(self, step: int) -> float:
        """The rate of optimiser step `step`: warm-up, then 1/sqrt(step) decay (the paper's),
        or with decay=linear a straight line to 0 at the end of the run's budget (its steps,
        epochs or minutes, whichever comes first), as budgeted training does."""
        c = self.config
        if c.decay == "inverse_sqrt":
            return inverse_sqrt(step, c.lr, c.warmup)
        planned = c.max_epochs * self.steps_per_epoch
        done = step / min(planned, c.max_steps or planned)
        if c.max_minutes:
            done = max(done, self.progress.elapsed / (c.max_minutes * 60))
        warm = min(step / c.warmup, 1.0) if c.warmup else 1.0
        return c.lr * warm * max(1.0 - done, 0.02)

    def step(self, group: Sequence[Any], bar: tqdm) -> bool:
        """One optimiser step over `group` (gradient accumulation); False if it is skipped."""
        c, p = self.config, self.progress
        start = time.perf_counter()
        self.model.train()
        lr = self.learning_rate(p.step + 1)
        group = distributed.padded(group, self.world)
        total = sum(self.task.n_targets(b) for b in group)  # of every rank's batches
        # With clipping off, an infinite max_norm still measures the norm (and scales by 1).
        max_norm = c.clip_norm if c.clip_norm > 0 else math.inf
        graphed = self.graphed_step(max_norm)
        if graphed is not None:
            assert isinstance(self.task, GraphableTask) and len(group) == 1
            loss_t, norm_t = graphed.step(self.task.padded_inputs(group[0], self.device), lr)
            loss_sum, norm, stats = float(loss_t), float(norm_t), dict[str, float]()
        else:
            mine = distributed.shard(group, self.rank, self.world)
            loss_sum, norm, stats = self.accumulate(mine, lr, total, max_norm)
        if not (math.isfinite(loss_sum) and math.isfinite(norm)):
            self.count_bad_step()
            return False
        p.bad_steps = 0
        p.step += 1
        seconds = time.perf_counter() - start
        p.elapsed += seconds
        per_target = {k: v / max(total, 1) for k, v in stats.items()}
        self.report_step(bar, loss_sum / max(total, 1), lr, total / seconds, per_target)
        return True

    def accumulate(
        self, group: Sequence[Any], lr: float, total: int, max_norm: float
    ) -> tuple[float, float, dict[str, float]]:
        """The step over every batch of `group` (this rank's), on the mean loss per target of
        the `total` targets of all ranks, unless the loss or the gradient is not finite;
        returns the summed loss, the gradient norm before clipping and the task's summed extra
        statistics, all of every rank."""
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = lr
        loss_sum, stats = 0.0, dict[str, float]()
        # DDP averages the ranks' gradients; each divides by total / world, so that the
        # average is the gradient of (every rank's summed loss) / total, as in one process.
        scale = max(total, 1) / self.world
        ddp = self.ddp  # under torchrun: the loss through DDP, whose hooks sync gradients
        for i, batch in enumerate(group):
            last = i == len(group) - 1  # DDP syncs at a step's last batch only
            sync = ddp.no_sync() if ddp is not None and not last else contextlib.nullcontext()
            with sync, self.autocast():
                loss, extra = ddp(batch) if ddp is not None else self.task.loss(batch, self.device)
            (loss / scale).backward()
            loss_sum += float(loss.detach())
            for key, value in extra.items():
                stats[key] = stats.get(key, 0.0) + value
        norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        loss_sum, stats = distributed.summed(loss_sum, stats)
        if math.isfinite(loss_sum) and math.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss_sum, norm, stats

    def count_bad_step(self) -> None:
        """Warn of a skipped step; stop the run after `max_bad_steps` of them in a row."""
        c, p = self.config, self.progress
        p.bad_steps += 1
        p.skipped_steps += 1
        print(f"warning: non-finite loss or gradient at step {p.step + 1}; batch skipped")
        if p.bad_steps >= c.max_bad_steps:
            last = ckpt.latest_good_checkpoint(self.checkpoints)[0]
            raise TrainingDiverged(
                f"{p.bad_steps} non-finite batches in a row at step {p.step + 1}: stopping. "
                f"Last good checkpoint: {last or 'none'}; try a lower lr or more warmup"
            )

    def report_step(
        self, bar: tqdm, loss: float, lr: float, targets_per_s: float, stats: dict[str, float]
    ) -> None:
        """The progress bar, and every `log_every` steps a train record (and a line when there
        is no bar)."""
        p = self.progress
        bar.update(1)
        bar.set_postfix(
            loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{targets_per_s:.0f}", epoch=p.epoch
        )
        if p.step % self.config.log_every != 0 and p.step != 1:
            return
        record = {
            "split": "train",
            "step": p.step,
            "epoch": p.epoch,
            "loss": loss,
            "lr": lr,
            "targets_per_s": targets_per_s,
            "elapsed_s": p.elapsed,
        }
        self.log.write(record | stats)
        if bar.disable and distributed.is_main():  # no bar (a log file, a pipe): a line instead
            print(
                f"step {p.step} train: loss {loss:.3f}, lr {lr:.2e}, "
                f"{targets_per_s:.0f} targets/s, epoch {p.epoch}",
                flush=True,
            )

    def graphed_step(self, max_norm: float) -> GraphedStep | None:
        """The CUDA-graph step where it applies: on a CUDA device with `cuda_graphs`, one
        batch per step, one process (no DDP, whose gradient hooks a graph cannot replay), and
        a task that can pad its batches to fixed shapes."""
        c = self.config
        applies = self.device.type == "cuda" and c.cuda_graphs and c.accumulate == 1
        if not applies or self.ddp is not None or not isinstance(self.task, GraphableTask):
            return None
        if self.graphed is None:
            if c.fast:  # else the reference model, whose shapes are fixed already
                fast.apply(self.model, packed=False)  # fixed shapes, no host sync
            dtype = torch.bfloat16 if c.bf16 else None
            self.graphed = GraphedStep(
                self.model, self.optimizer, self.task.padded_loss, max_norm, dtype
            )
        return self.graphed

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.device.type == "cuda" and self.config.bf16:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def evaluate(self) -> dict[str, float]:
        self.model.eval()
        with torch.no_grad(), self.autocast():
            return self.task.evaluate(self.device)

    def validate(self) -> None:
        """Validate, log, keep the best weights, checkpoint, and apply early stopping."""
        c, p = self.config, self.progress
        # Rank 0 validates while the others wait for its metrics, on which all then act alike.
        metrics = distributed.from_main(self.evaluate() if distributed.is_main() else {})
        value = metrics[self.task.metric]
        self.log.write({"split": "valid", "step": p.step, "epoch": p.epoch, **metrics})
        p.history.append({"step": p.step, **metrics})
        if value > p.best:
            p.best, p.best_step, p.evals_since_best = value, p.step, 0
            if distributed.is_main():
                ckpt.save_weights(self.model, self.run_dir / "model.safetensors")
        else:
            p.evals_since_best += 1
        summary = " ".join(f"{k} {v:.4g}" for k, v in metrics.items())
        tqdm.write(f"step {p.step} valid: {summary} (best {p.best:.4g} at step {p.best_step})")
        if c.patience and p.evals_since_best >= c.patience:
            tqdm.write(f"early stopping: no better {self.task.metric} for {c.patience} validations")
            p.done = True
        self.save()

    def finish(self) -> None:
        """Try the average of the last k checkpoints; keep it if it validates better."""
        c, p = self.config, self.progress
        if not c.average_last or not distributed.is_main():
            return
        found = []
        for directory in ckpt.list_checkpoints(self.checkpoints)[-c.average_last :]:
            if problem := ckpt.checkpoint_problem(directory):
                print(f"warning: not averaging a bad checkpoint: {problem}")
            else:
                found.append(directory)
        if len(found) < 2:
            return
        self.model.load_state_dict(ckpt.average_weights(found), strict=False)
        metrics = self.evaluate()
        self.log.write({"split": "valid", "step": p.step, "averaged": len(found), **metrics})
        tqdm.write(
            f"average of last {len(found)} checkpoints: {self.task.metric} "
            f"{metrics[self.task.metric]:.4g} (best single {p.best:.4g})"
        )
        if metrics[self.task.metric] > p.best:
            p.best, p.best_step = metrics[self.task.metric], p.step
            ckpt.save_weights(self.model, self.run_dir / "model.safetensors")
            latest = self.checkpoint_at(p.step)
            if latest.is_dir():  # a resumed run must know what model.safetensors scores
                ckpt.update_progress(latest, vars(p))
        ckpt.load_weights(self.model, self.run_dir / "model.safetensors")


def inverse_sqrt(step: int, peak_lr: float, warmup: int) -> float:
    """Linear warm-up to `peak_lr` over `warmup` steps, then decay with 1/sqrt(step): the
    paper's schedule (section 5.3), written with its peak value instead of d_model."""
    step, warmup = max(step, 1), max(warmup, 1)
    return peak_lr * min(step / warmup, math.sqrt(warmup / step))
