"""Small models and batches shared by the model tests."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from qkv.model.config import ModelConfig


def tiny_config(**overrides: object) -> ModelConfig:
    fields: dict[str, object] = dict(
        vocab_size=40,
        d_model=32,
        n_heads=4,
        d_ff=64,
        n_encoder_layers=2,
        n_decoder_layers=2,
        dropout=0.0,
        max_len=64,
    )
    fields.update(overrides)
    return ModelConfig(**fields)  # type: ignore[arg-type]


def random_ids(batch: int, length: int, vocab: int = 40, low: int = 5) -> torch.Tensor:
    return torch.randint(low, vocab, (batch, length))


def padded_ids(lengths: Iterable[int], length: int, vocab: int = 40) -> torch.Tensor:
    """(B, length) random real ids, each row padded (id 0) after its own length."""
    rows = list(lengths)
    ids = random_ids(len(rows), length, vocab)
    for row, real in enumerate(rows):
        ids[row, real:] = 0
    return ids


def overfit(
    parameters: Iterable[nn.Parameter],
    loss: Callable[[], torch.Tensor],
    steps: int = 150,
    lr: float = 1e-2,
) -> tuple[float, float]:
    """Adam on one fixed batch: (the first loss, the last loss)."""
    optimizer = torch.optim.Adam(parameters, lr=lr)
    losses = []
    for _ in range(steps):
        value = loss()
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
        losses.append(value.item())
    return losses[0], losses[-1]
