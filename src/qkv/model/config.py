"""The model's typed configuration, validated once when it is made."""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from qkv.errors import ConfigError
from qkv.fits import fits, type_name

MAX_POSITIONS = 65536
"""The most positions a model may have: its sinusoid table is made for all of them at once."""

Activation = Literal["relu", "gelu"]
Positions = Literal["sinusoidal", "learned"]
Pooling = Literal["mean", "cls"]


@dataclass
class ModelConfig:
    """Architecture of a Transformer encoder-decoder or encoder classifier."""

    vocab_size: int = 8000  # source vocabulary (also the target one when tgt_vocab_size is None)
    tgt_vocab_size: int | None = None  # None: one joint vocabulary for source and target
    d_model: int = 512  # width of every residual stream
    n_heads: int = 8  # attention heads; d_model must divide by it
    d_ff: int = 2048  # inner width of the position-wise feed-forward network
    n_encoder_layers: int = 6  # N in the paper
    n_decoder_layers: int = 6  # 0 for a classifier
    dropout: float = 0.1  # on embeddings, sub-layer outputs (P_drop) and the FFN's hidden layer
    attention_dropout: float = 0.0  # on the attention weights
    activation: Activation = "relu"  # of the feed-forward network
    norm_first: bool = False  # False: post-norm as in the paper; True: pre-norm + final norms
    positions: Positions = "sinusoidal"  # fixed sinusoids (paper) or learned embeddings
    max_len: int = 1024  # longest sequence the position table covers
    tie_embeddings: bool = True  # share source, target and output embeddings (joint vocab only)
    pad_id: int = 0  # padding token id, masked everywhere
    n_classes: int = 0  # classifier only: number of labels
    pooling: Pooling = "mean"  # classifier only: masked mean over tokens, or a [CLS] token
    head_dropout: float = 0.1  # classifier only: dropout between pooling and the output layer

    def __post_init__(self) -> None:
        self._check_types()
        checks = [
            (self.vocab_size > 0, f"vocab_size must be positive, got {self.vocab_size}"),
            (
                self.tgt_vocab_size is None or self.tgt_vocab_size > 0,
                f"tgt_vocab_size must be positive, got {self.tgt_vocab_size}",
            ),
            (self.d_model > 0 and self.n_heads > 0, "d_model and n_heads must be positive"),
            (
                self.d_model % max(self.n_heads, 1) == 0,
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})",
            ),
            (self.d_ff > 0, f"d_ff must be positive, got {self.d_ff}"),
            (self.n_encoder_layers > 0, "n_encoder_layers must be at least 1"),
            (self.n_decoder_layers >= 0, "n_decoder_layers must be 0 or more"),
            (0.0 <= self.dropout < 1.0, f"dropout must be in [0, 1), got {self.dropout}"),
            (
                0.0 <= self.attention_dropout < 1.0,
                f"attention_dropout must be in [0, 1), got {self.attention_dropout}",
            ),
            (
                0.0 <= self.head_dropout < 1.0,
                f"head_dropout must be in [0, 1), got {self.head_dropout}",
            ),
            (self.activation in ("relu", "gelu"), f"unknown activation {self.activation!r}"),
            (self.positions in ("sinusoidal", "learned"), f"unknown positions {self.positions!r}"),
            (self.pooling in ("mean", "cls"), f"unknown pooling {self.pooling!r}"),
            (
                0 < self.max_len <= MAX_POSITIONS,
                f"max_len must be between 1 and {MAX_POSITIONS}, got {self.max_len}",
            ),
            (
                0 <= self.pad_id < min(self.vocab_size, self.target_vocab_size),
                "pad_id must be a token id of both vocabularies",
            ),
            (self.n_classes >= 0, "n_classes must be 0 or more"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    def _check_types(self) -> None:
        """Raise ConfigError for a value of the wrong type (2.0 or True for an int, say); the
        named choices (activation, positions, pooling) are checked with their own messages."""
        for name, hint in typing.get_type_hints(ModelConfig).items():
            value = getattr(self, name)
            if typing.get_origin(hint) is not typing.Literal and not fits(value, hint):
                raise ConfigError(f"{name} must be of type {type_name(hint)}, got {value!r}")

    @property
    def target_vocab_size(self) -> int:
        return self.vocab_size if self.tgt_vocab_size is None else self.tgt_vocab_size

    @property
    def joint_vocab(self) -> bool:
        return self.tgt_vocab_size is None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown model config keys: {', '.join(unknown)}")
        return cls(**data)
