"""Named configurations, as functions; `key=value` overrides are applied on top of them."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from qkv.errors import ConfigError
from qkv.model.config import ModelConfig
from qkv.training.config import TrainConfig

if TYPE_CHECKING:
    from qkv.tasks.classification import ClassificationData


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


def translation_preset(name: str) -> tuple[ModelConfig, TrainConfig]:
    """Model and training configs of the translation preset `name` (the data comes from the
    flags)."""
    presets = {
        "tiny": (
            ModelConfig(
                vocab_size=64,
                d_model=64,
                n_heads=4,
                d_ff=128,
                n_encoder_layers=2,
                n_decoder_layers=2,
                max_len=256,
            ),
            TrainConfig(lr=3e-3, warmup=100, max_tokens=1024, eval_every=100, max_epochs=30),
        ),
        "multi30k-cpu": (
            transformer_small(),
            TrainConfig(
                lr=1e-3,
                warmup=400,
                max_tokens=3000,
                eval_every=300,
                max_epochs=40,
                max_minutes=55,
                average_last=3,
                keep_checkpoints=3,
            ),
        ),
        "multi30k-gpu": (
            replace(transformer_base(), dropout=0.2),
            TrainConfig(
                lr=7e-4,
                warmup=2000,
                max_tokens=8192,
                eval_every=500,
                max_epochs=60,
                average_last=5,
                keep_checkpoints=5,
                patience=8,
            ),
        ),
        "small": (transformer_small(), TrainConfig(lr=1e-3, warmup=2000)),
        "base": (transformer_base(), TrainConfig(lr=7e-4, warmup=4000, max_tokens=8192)),
        "big": (transformer_big(), TrainConfig(lr=5e-4, warmup=4000, max_tokens=8192)),
    }
    if name not in presets:
        raise ConfigError(f"unknown translation preset {name!r}; choose from {', '.join(presets)}")
    return presets[name]


def classification_preset(name: str) -> tuple[ModelConfig, TrainConfig, ClassificationData]:
    """Model, training and data settings of the classification preset `name`; `seed` mirrors
    the Keras tutorial's classifier (see docs/cli.md), `strong` is a full encoder over long
    head+tail excerpts."""
    from qkv.tasks.classification import ClassificationData

    presets = {
        "tiny": (
            ModelConfig(d_model=32, n_heads=2, d_ff=64, n_encoder_layers=1, max_len=128),
            TrainConfig(lr=3e-3, warmup=20, max_tokens=2048, eval_every=50, max_epochs=10),
            ClassificationData(vocab_size=500, max_len=64),
        ),
        "seed": (
            ModelConfig(
                d_model=128,
                n_heads=1,
                d_ff=128,
                n_encoder_layers=1,
                dropout=0.1,
                head_dropout=0.5,
                max_len=80,
            ),
            TrainConfig(
                lr=1e-3,
                warmup=100,
                max_tokens=32 * 64,
                eval_every=250,
                max_epochs=5,
                clip_norm=0.0,
            ),
            ClassificationData(vocab_size=20000, max_len=80, head_tail=True),
        ),
        "strong": (
            ModelConfig(
                d_model=128,
                n_heads=4,
                d_ff=512,
                n_encoder_layers=2,
                dropout=0.2,
                head_dropout=0.3,
                max_len=512,
            ),
            TrainConfig(
                lr=1e-3,
                warmup=300,
                max_tokens=32 * 512,
                eval_every=175,
                max_epochs=3,
                weight_decay=0.01,
                average_last=3,
                max_minutes=55,
            ),
            ClassificationData(vocab_size=16000, max_len=512, head_tail=True, lowercase=True),
        ),
    }
    if name not in presets:
        raise ConfigError(
            f"unknown classification preset {name!r}; choose from {', '.join(presets)}"
        )
    # Every classification preset is an encoder alone, trained without label smoothing.
    model, train, data = presets[name]
    return replace(model, n_decoder_layers=0), replace(train, label_smoothing=0.0), data


SMALL_DATA = 20_000
"""Labelled texts below which a classification run without a preset regularises more."""


def fitted_classification(examples: int) -> dict[str, str]:
    """What a classification run without a preset changes in `strong` for a training file of
    `examples` texts: on fewer than `SMALL_DATA` (the preset was tuned on IMDB's 25,000), a
    smaller vocabulary, more dropout and weight decay, against over-fitting, and a validation
    every 40 steps (some 25 over the planned 1,000), so the best weights are not missed when
    the model starts learning its training set by heart, its noisy labels first."""
    if examples >= SMALL_DATA:
        return {}
    return {"vocab_size": "4000", "dropout": "0.3", "weight_decay": "0.1", "eval_every": "40"}
