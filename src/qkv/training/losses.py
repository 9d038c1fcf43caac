"""Label-smoothed cross-entropy, computed only where there is a real target token."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from qkv.model.seq2seq import Seq2SeqTransformer


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
    """`smoothed_cross_entropy` over rows that include padding, which is ignored.

    The same sum as `nonpad_logits` then `smoothed_cross_entropy`, at shapes that do not
    depend on how many targets are real: what a step recorded as a CUDA graph needs.

    Args:
        logits: (..., V); labels: (...), `pad_id` where there is no target.
    """
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)).float(),  # (N, V)
        labels.reshape(-1),  # (N,)
        ignore_index=pad_id,
        label_smoothing=smoothing,
        reduction="sum",
    )


def bucket_loss(
    model: Seq2SeqTransformer, inputs: dict[str, Tensor], smoothing: float, pad_id: int
) -> tuple[Tensor, Tensor]:
    """Summed smoothed cross-entropy and target count (0-dim each) of `bucket_inputs`, with
    no host sync: the loss of a translation step recorded as a CUDA graph.

    Args:
        inputs: src (B, S), tgt_in (B, T), rows (K,) and labels (K,) on the model's device.
    """
    states = model.hidden(inputs["src"], inputs["tgt_in"], packed=False)  # (B, T, D)
    picked = states.flatten(0, 1).index_select(0, inputs["rows"])  # (K, D)
    labels = inputs["labels"]  # (K,)
    loss = padded_cross_entropy(model.output(picked), labels, smoothing, pad_id)
    return loss, (labels != pad_id).sum()
