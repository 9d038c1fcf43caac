"""Label-smoothed cross-entropy, computed only where there is a real target token."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from qkv.fast import fused_loss
from qkv.fast.packing import Packing
from qkv.model.seq2seq import Seq2SeqTransformer


def nonpad_logits(
    output: nn.Module, states: Tensor, labels: Tensor, pad_id: int
) -> tuple[Tensor, Tensor]:
    """Project only the decoder states whose label is a real token.

    The output projection is a step's largest matmul; padded rows would waste it. On the CPU
    the M real rows are rounded up to `padded_rows(M)` with filler rows labelled `pad_id`, the
    row count oneDNN's linear layers take (`qkv.fast.linear`), so the logits' gradient needs
    no widened copy.

    Args:
        output: the output projection (D -> V).
        states: decoder states (B, T, D).
        labels: next-token labels (B, T), `pad_id` where there is none.

    Returns:
        logits (M', V) and labels (M',): the M real target positions, then M' - M rows
        labelled `pad_id` (none on a GPU), which `smoothed_cross_entropy(..., ignore_index=
        pad_id)` leaves out.
    """
    rows = Packing.from_mask(labels != pad_id, round_rows=states.device.type == "cpu")
    picked = rows.pack(labels)  # (M',)
    picked[rows.count :] = pad_id
    return output(rows.pack(states)), picked  # (M', V), (M',)


def smoothed_cross_entropy(
    logits: Tensor,
    labels: Tensor,
    smoothing: float,
    ignore_index: int = -100,
) -> Tensor:
    """Summed label-smoothed cross-entropy: logits (M, V), labels (M,) -> scalar.

    Rows whose label is `ignore_index` add nothing: `bucket_loss` passes the padding id, for
    the filler rows of a fixed-length list of targets. A big CPU training loss runs as
    `qkv.fast.fused_loss`'s compiled loops (the same values up to float rounding).
    """
    if fused_loss.applies(logits):
        return fused_loss.smoothed_cross_entropy(logits, labels, smoothing, ignore_index)
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
    """Summed smoothed cross-entropy and target count (0-dim each) of `bucket_inputs`, with
    no host sync: the loss of a translation step recorded as a CUDA graph.

    Args:
        inputs: src (B, S), tgt_in (B, T), rows (K,) and labels (K,) on the model's device.
    """
    states = model.hidden(inputs["src"], inputs["tgt_in"])  # (B, T, D)
    picked = states.flatten(0, 1).index_select(0, inputs["rows"])  # (K, D)
    labels = inputs["labels"]  # (K,)
    loss = smoothed_cross_entropy(model.output(picked), labels, smoothing, ignore_index=pad_id)
    return loss, (labels != pad_id).sum()
