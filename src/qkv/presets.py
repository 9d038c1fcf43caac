"""Named configurations, as functions. `key=value` overrides are applied on top of them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from qkv.errors import ConfigError
from qkv.model.config import ModelConfig


def transformer_base(vocab_size: int = 37000) -> ModelConfig:
    """The paper's base model: D 512, 8 heads, F 2048, 6+6 layers, dropout 0.1."""
    return ModelConfig(vocab_size=vocab_size)


def transformer_big(vocab_size: int = 37000) -> ModelConfig:
    """The paper's big model: D 1024, 16 heads, F 4096, 6+6 layers, dropout 0.3."""
    return ModelConfig(vocab_size=vocab_size, d_model=1024, n_heads=16, d_ff=4096, dropout=0.3)


def transformer_small(vocab_size: int = 8000) -> ModelConfig:
    """A CPU-sized translation model: D 256, 4 heads, F 1024, 3+3 layers."""
    return ModelConfig(
        vocab_size=vocab_size,
        d_model=256,
        n_heads=4,
        d_ff=1024,
        n_encoder_layers=3,
        n_decoder_layers=3,
    )


def transformer_tiny(vocab_size: int = 64) -> ModelConfig:
    """For tests and the demo: D 64, 4 heads, F 128, 2+2 layers."""
    return ModelConfig(
        vocab_size=vocab_size,
        d_model=64,
        n_heads=4,
        d_ff=128,
        n_encoder_layers=2,
        n_decoder_layers=2,
        max_len=256,
    )


MODEL_PRESETS: dict[str, Callable[..., ModelConfig]] = {
    "base": transformer_base,
    "big": transformer_big,
    "small": transformer_small,
    "tiny": transformer_tiny,
}


def model_preset(name: str, **overrides: Any) -> ModelConfig:
    """The model preset `name` with fields replaced by `overrides`."""
    if name not in MODEL_PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose from {', '.join(MODEL_PRESETS)}")
    return replace(MODEL_PRESETS[name](), **overrides)
