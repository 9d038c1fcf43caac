"""The training plan: a schedule that means the same on 5,000 examples as on 5,000,000.

Presets give batch size, warm-up, evaluation interval and epochs in steps and passes, tuned on
Multi30k and IMDB. On data far smaller, those steps would never be taken (a run that ends
inside its warm-up learns little), so before training the plan scales them to the data:

- batches: at least `MIN_BATCHES` a pass, the token budget lowered to get them;
- steps: at least `MIN_STEPS` optimiser steps, more passes added to get them (within what
  `max_steps` allows);
- warm-up: at most `WARMUP_SHARE` of the planned steps, evaluation at least `MIN_EVALS` times.

Under torchrun a step takes `accumulate` batches on each of the processes: a pass has that many
times fewer steps. Settings given explicitly (on the command line) are kept as given. On
Multi30k and IMDB the presets' own values come out unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from qkv.training.config import TrainConfig
from qkv.training.distributed import world_size

MIN_BATCHES = 50
"""Batches a pass over the data, at the least (the token budget shrinks to reach it)."""
MIN_STEPS = 1000
"""Optimiser steps planned, at the least (passes are added to reach them)."""
WARMUP_SHARE = 0.6
"""The largest share of the planned steps that warm-up may take."""
MIN_EVALS = 5
"""Validations planned over a run, at the least."""
MIN_TOKENS = 256
"""The smallest token budget of a batch the plan chooses."""


@dataclass(frozen=True)
class Plan:
    """What a run is planned to do, fixed before its first step."""

    examples: int
    max_tokens: int  # the batches' budget of padded tokens
    steps_per_epoch: int
    steps: int
    warmup: int
    eval_every: int
    minutes: float  # 0: no time budget
    processes: int = 1  # under torchrun: each takes its own batches of `max_tokens`

    def describe(self) -> str:
        budget = f", within {self.minutes:g} minutes" if self.minutes else ""
        each = f" on each of {self.processes} processes" if self.processes > 1 else ""
        return (
            f"{self.examples:,} examples, {self.steps:,} steps planned "
            f"({self.steps / self.steps_per_epoch:.3g} epochs of "
            f"{self.steps_per_epoch:,}, batches of {self.max_tokens:,} tokens{each}), warm-up "
            f"{self.warmup:,} steps, evaluation every {self.eval_every:,}{budget}"
        )


def plan_training(
    config: TrainConfig, examples: int, tokens: int, explicit: frozenset[str] = frozenset()
) -> tuple[Plan, TrainConfig]:
    """The plan for `examples` examples of `tokens` padded tokens a pass, and the config with
    its batch size, epochs, warm-up and evaluation interval set from it. `explicit` names the
    settings the user gave, which are kept."""
    c = config

    def unless_explicit(name: str, value: int) -> int:
        """`value`, unless the user gave the setting `name`."""
        return getattr(c, name) if name in explicit else value

    max_tokens = unless_explicit(
        "max_tokens", min(c.max_tokens, max(MIN_TOKENS, tokens // MIN_BATCHES))
    )
    processes = world_size()
    per_epoch = max(1, math.ceil(tokens / max_tokens) // (c.accumulate * processes))
    epochs = unless_explicit("max_epochs", max(c.max_epochs, math.ceil(MIN_STEPS / per_epoch)))
    steps = per_epoch * epochs
    if c.max_steps:
        steps = min(steps, c.max_steps)
    warmup = unless_explicit("warmup", min(c.warmup, max(1, round(WARMUP_SHARE * steps))))
    eval_every = unless_explicit("eval_every", min(c.eval_every, max(1, steps // MIN_EVALS)))
    planned = replace(
        c, max_tokens=max_tokens, max_epochs=epochs, warmup=warmup, eval_every=eval_every
    )
    plan = Plan(
        examples, max_tokens, per_epoch, steps, warmup, eval_every, c.max_minutes, processes
    )
    return plan, planned


def planned(
    config: TrainConfig, lengths: Sequence[int] | np.ndarray, explicit: frozenset[str]
) -> tuple[TrainConfig, str]:
    """`config` planned for examples of these padded `lengths`, and the plan's line."""
    total = int(np.sum(lengths, dtype=np.int64)) if len(lengths) else 0
    plan, config = plan_training(config, len(lengths), total, explicit)
    return config, plan.describe()
