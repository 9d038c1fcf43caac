"""Label-smoothed cross-entropy, computed only where there is a real target token."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


def nonpad_logits(
    output: nn.Module, states: Tensor, labels: Tensor, pad_id: int
) -> tuple[Tensor, Tensor]:
    """Project only the decoder states whose label is a real token.

    The output projection is the largest matmul of a step; skipping padded rows saves it
    where it would be wasted.

    Args:
        output: the output projection (D -> V).
        states: decoder states (B, T, D).
        labels: next-token labels (B, T), `pad_id` where there is none.

    Returns:
        logits (M, V) and labels (M,) for the M real target positions.
    """
    keep = labels != pad_id  # (B, T)
    return output(states[keep]), labels[keep]  # (M, V), (M,)


def smoothed_cross_entropy(logits: Tensor, labels: Tensor, smoothing: float) -> Tensor:
    """Summed label-smoothed cross-entropy: logits (M, V), labels (M,) -> scalar."""
    return F.cross_entropy(logits.float(), labels, label_smoothing=smoothing, reduction="sum")


def padded_cross_entropy(logits: Tensor, labels: Tensor, smoothing: float, pad_id: int) -> Tensor:
    """`smoothed_cross_entropy` over every position of a padded batch, padding ignored.

    The same sum as `nonpad_logits` then `smoothed_cross_entropy`, at shapes that depend on the
    batch's shape alone: what a step recorded as a CUDA graph needs, where selecting the real
    rows would wait for the device to count them.

    Args:
        logits: (B, T, V); labels: (B, T), `pad_id` where there is no target.
    """
    return F.cross_entropy(
        logits.flatten(0, 1).float(),  # (B * T, V)
        labels.flatten(),  # (B * T,)
        ignore_index=pad_id,
        label_smoothing=smoothing,
        reduction="sum",
    )
