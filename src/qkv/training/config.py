"""The training configuration, typed and validated once."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from qkv.errors import ConfigError

MAX_THREADS = 1024  # far more make the tokenizer's thread pool fail


@dataclass
class TrainConfig:
    """How to train: optimiser, schedule, batching, evaluation, checkpoints, budget."""

    lr: float = 7e-4  # peak learning rate, reached at the end of warm-up
    warmup: int = 4000  # linear warm-up steps, then 1/sqrt(step) decay
    decay: str = "inverse_sqrt"  # after warm-up: 1/sqrt(step), or linear to 0 at the budget
    beta1: float = 0.9  # AdamW beta1
    beta2: float = 0.98  # AdamW beta2 (the paper's value)
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    label_smoothing: float = 0.1  # epsilon_ls of the paper
    clip_norm: float = 1.0  # gradient clipping by global norm; 0 = off
    accumulate: int = 1  # batches whose gradients are summed before one optimiser step
    max_tokens: int = 4096  # token budget of one batch (padded tokens, the longest side)
    max_epochs: int = 50  # stop after this many passes over the data
    max_steps: int = 0  # stop after this many optimiser steps; 0 = no limit
    max_minutes: float = 0.0  # stop after this much training time; 0 = no limit
    eval_every: int = 500  # validate (and checkpoint) every N optimiser steps
    patience: int = 0  # stop after N validations without improvement; 0 = never
    keep_checkpoints: int = 3  # newest checkpoints kept on disk
    average_last: int = 0  # at the end, try the average of the last k checkpoints; 0 = off
    seed: int = 1  # seeds data order, initialisation and dropout
    device: str = "auto"  # "auto", "cpu" or "cuda"
    bf16: bool = True  # bf16 autocast on CUDA (ignored on CPU)
    cuda_graphs: bool = True  # on CUDA, replay each training step as a CUDA graph (translation)
    threads: int = 0  # CPU threads for torch; 0 = torch's default
    log_every: int = 50  # write a train record every N optimiser steps
    max_bad_steps: int = 5  # stop after this many non-finite steps in a row
    deterministic: bool = False  # torch deterministic algorithms (exact resume on CPU)
    compile: bool = True  # CPU: dropout as compiled loops (torch.compile, once)
    fast: bool = True  # qkv.fast's paths (docs/performance.md); False: the reference model

    def __post_init__(self) -> None:
        checks = [
            (0 < self.lr < math.inf, "lr must be a positive number"),
            (self.warmup >= 0, "warmup must be 0 or more"),
            (self.decay in ("inverse_sqrt", "linear"), "decay must be inverse_sqrt or linear"),
            (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "betas must be in [0, 1)"),
            (0 <= self.label_smoothing < 1, "label_smoothing must be in [0, 1)"),
            (self.accumulate >= 1, "accumulate must be at least 1"),
            (self.max_tokens >= 16, "max_tokens must be at least 16"),
            (self.max_epochs >= 1, "max_epochs must be at least 1"),
            (self.eval_every >= 1, "eval_every must be at least 1"),
            (self.keep_checkpoints >= 1, "keep_checkpoints must be at least 1"),
            (self.average_last >= 0, "average_last must be 0 or more"),
            (self.device in ("auto", "cpu", "cuda"), f"unknown device {self.device!r}"),
            (self.max_bad_steps >= 1, "max_bad_steps must be at least 1"),
            (self.max_steps >= 0, "max_steps must be 0 (no limit) or more"),
            (0 <= self.max_minutes < math.inf, "max_minutes must be 0 (no limit) or more"),
            (self.patience >= 0, "patience must be 0 (never stop early) or more"),
            (0 <= self.clip_norm < math.inf, "clip_norm must be 0 (off) or more"),
            (0 <= self.weight_decay < math.inf, "weight_decay must be a number, 0 or more"),
            (
                0 <= self.threads <= MAX_THREADS,
                f"threads must be 0 (torch's default) or more, up to {MAX_THREADS}",
            ),
            (0 <= self.seed < 2**63, "seed must be between 0 and 2**63 - 1"),
            (self.log_every >= 1, "log_every must be at least 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown training config keys: {', '.join(unknown)}")
        return cls(**data)
