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
