"""What the trainer needs from a task (translation, classification, ...)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn


class TrainingTask(Protocol):
    """A model, its batches, its loss and its validation, seen from the trainer."""

    metric: str  # the validation metric to maximise ("bleu", "accuracy", ...)

    @property
    def model(self) -> nn.Module:
        """The network being trained."""

    def batches(self, epoch: int) -> Sequence[Any]:
        """The training batches of `epoch`, in order; a pure function of (seed, epoch)."""

    def n_targets(self, batch: Any) -> int:
        """The number of loss terms (target tokens or examples) in a batch."""

    def loss(self, batch: Any, device: torch.device) -> tuple[Tensor, dict[str, float]]:
        """Summed loss of a batch and extra statistics to log (e.g. correct predictions)."""

    def evaluate(self, device: torch.device) -> dict[str, float]:
        """Validation metrics, including "loss" and `metric`."""


@runtime_checkable
class GraphableTask(TrainingTask, Protocol):
    """A task whose training step can be recorded as a CUDA graph (`qkv.training.graphed`)."""

    def padded_inputs(self, batch: Any, device: torch.device) -> dict[str, Tensor]:
        """The batch's tensors on `device`, padded to one of a few bucket shapes."""

    def padded_loss(self, inputs: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Summed loss and number of targets (0-dim) of padded inputs, with no host sync."""
