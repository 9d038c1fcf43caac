"""Learning-rate schedules as pure functions of the step (1-based)."""

from __future__ import annotations

import math


def inverse_sqrt(step: int, peak_lr: float, warmup: int) -> float:
    """Linear warm-up to `peak_lr` over `warmup` steps, then decay with 1/sqrt(step).

    This is the paper's schedule (section 5.3), d_model^-0.5 * min(step^-0.5, step *
    warmup^-1.5), written with its peak value instead of d_model.
    """
    step = max(step, 1)
    warmup = max(warmup, 1)
    return peak_lr * min(step / warmup, math.sqrt(warmup / step))


def noam(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """The paper's formula as printed: factor * d_model^-0.5 * min(step^-0.5, step*warmup^-1.5)."""
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
