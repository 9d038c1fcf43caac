"""What a finished run says about itself: the signs of a wasted run, from its metrics."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

WARMUP_MARGIN = 1.5
"""A run that stops before this many warm-ups' worth of steps barely left its warm-up."""


def run_warnings(
    records: Sequence[dict[str, Any]],
    warmup: int,
    metric: str,
    trivial: float,
    skipped_steps: int = 0,
) -> list[str]:
    """Plain sentences for each sign of a wasted run in `records` (metrics.jsonl's records):
    it ended within or just after its warm-up of `warmup` steps, it never validated, its
    validation `metric` never beat `trivial` (the majority class's accuracy, say), or its loss
    went non-finite (`skipped_steps` batches skipped for it)."""
    train = [r for r in records if r.get("split") == "train"]
    valid = [r for r in records if r.get("split") == "valid" and metric in r]
    steps = max((int(r.get("step", 0)) for r in records), default=0)
    found = []
    if warmup and steps < WARMUP_MARGIN * warmup:
        where = "within" if steps <= warmup else "just after"
        found.append(
            f"training ended at step {steps}, {where} its warm-up of {warmup} steps, before the "
            "learning rate ran its course: train for more steps (max_epochs, max_steps, "
            "max_minutes) or set a shorter warmup"
        )
    if not valid:
        found.append(
            f"the run never validated ({steps} steps, none of them an evaluation): its "
            "quality is unknown and the weights are its last ones; lower eval_every"
        )
    elif max(float(r[metric]) for r in valid) <= trivial:
        trivially = "always the commonest label" if metric == "accuracy" else "empty translations"
        found.append(
            f"validation {metric} never beat {trivial:.4g}, what {trivially} would score: the "
            "model learned nothing useful"
        )
    losses = [r.get("loss") for r in [*train, *valid]]
    if skipped_steps or any(isinstance(x, float) and not math.isfinite(x) for x in losses):
        found.append(
            f"the loss went non-finite (NaN or infinity): {skipped_steps} batch(es) skipped; "
            "a lower lr or a longer warmup may help"
        )
    return found
