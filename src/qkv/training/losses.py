"""Label-smoothed cross-entropy, computed only where there is a real target token."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from qkv.fast.packing import Packing
from qkv.model.seq2seq import Seq2SeqTransformer


def nonpad_logits(
    output: nn.Module, states: Tensor, labels: Tensor, pad_id: int
) -> tuple[Tensor, Tensor]:
    """Logits (M', V) and labels (M',) of the M decoder states (B, T, D) whose label (B, T)
    is not `pad_id`: the output projection, a step's largest matmul, skips padding. On the CPU,
    M' rounds M up to the row count `qkv.fast.linear` takes, with rows labelled `pad_id`."""
    rows = Packing.from_mask(labels != pad_id, round_rows=states.device.type == "cpu")
    picked = rows.pack(labels)  # (M',)
    picked[rows.count :] = pad_id
    return output(rows.pack(states)), picked  # (M', V), (M',)


def smoothed_cross_entropy(
    logits: Tensor, labels: Tensor, smoothing: float, ignore_index: int = -100
) -> Tensor:
    """Summed label-smoothed cross-entropy: logits (M, V), labels (M,) -> scalar; rows labelled
    `ignore_index` add nothing."""
    return F.cross_entropy(
        logits.float(),
        labels,
        ignore_index=ignore_index,
        label_smoothing=smoothing,
        reduction="sum",
    )


def bucket_loss(
    model: Seq2SeqTransformer, inputs: dict[str, Tensor], smoothing: float, pad_id: int
) -> tuple[Tensor, Tensor]:
    """Summed smoothed cross-entropy and target count (0-dim each) of `bucket_inputs` on the
    model's device, with no host sync: the loss of a translation step recorded as a CUDA graph.
    """
    states = model.hidden(inputs["src"], inputs["tgt_in"])  # (B, T, D)
    picked = states.flatten(0, 1).index_select(0, inputs["rows"])  # (K, D)
    labels = inputs["labels"]  # (K,)
    loss = smoothed_cross_entropy(model.output(picked), labels, smoothing, ignore_index=pad_id)
    return loss, (labels != pad_id).sum()
