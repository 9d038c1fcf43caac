"""Small models and batches shared by the model tests."""

from __future__ import annotations

import torch

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
