"""Attention weights returned to the caller, never kept on the modules."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class AttentionMaps:
    """Per-layer softmax weights of one forward pass.

    Attributes:
        encoder_self: one (B, H, S, S) tensor per encoder layer.
        decoder_self: one (B, H, T, T) tensor per decoder layer.
        cross: one (B, H, T, S) tensor per decoder layer.
    """

    encoder_self: list[Tensor] = field(default_factory=list)
    decoder_self: list[Tensor] = field(default_factory=list)
    cross: list[Tensor] = field(default_factory=list)
