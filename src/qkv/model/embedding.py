"""Token embeddings (a lookup table scaled by sqrt(d_model)) and positional encodings."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class TokenEmbedding(nn.Module):
    """Lookup table whose vectors are multiplied by sqrt(D), as in the paper (section 3.4)."""

    def __init__(self, vocab_size: int, d_model: int, pad_id: int) -> None:
        super().__init__()
        self.table = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.scale = math.sqrt(d_model)

    def forward(self, ids: Tensor) -> Tensor:
        """ids (B, L) -> (B, L, D)."""
        return self.table(ids) * self.scale


def check_ids(ids: Tensor, vocab_size: int, name: str) -> None:
    """Raise TypeError unless `ids` is a tensor, ValueError unless it is (B, L) int64 or int32
    ids in [0, vocab_size). The range is checked on CPU tensors only: on a GPU the check would
    wait for the device at every call, and the embedding kernel stops at a bad id anyway."""
    if not isinstance(ids, Tensor):
        raise TypeError(f"{name} must be a torch tensor of token ids, got {type(ids).__name__}")
    if ids.dim() != 2:
        raise ValueError(f"{name} must be (B, L) token ids, got shape {tuple(ids.shape)}")
    if ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{name} must hold int64 (or int32) token ids, got {ids.dtype}")
    if ids.device.type == "cpu" and ids.numel() > 0 and not torch.compiler.is_compiling():
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(
                f"{name} holds token id {bad}, outside the vocabulary [0, {vocab_size})"
            )


def sinusoid_table(max_len: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D)).

    Returns:
        (max_len, D) float table.
    """
    position = torch.arange(max_len, dtype=torch.float64)[:, None]  # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (D/2,)
    angle = position / torch.pow(10000.0, two_i / d_model)  # (L, D/2)
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal positions: a buffer, never trained, not saved in checkpoints."""

    table: Tensor

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.register_buffer("table", sinusoid_table(max_len, d_model), persistent=False)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """Positions offset .. offset+length-1 -> (length, D)."""
        return table_rows(self.table, length, offset)


class LearnedPositions(nn.Module):
    """One trained vector per position."""

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.table = nn.Embedding(max_len, d_model)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """Positions offset .. offset+length-1 -> (length, D)."""
        return table_rows(self.table.weight, length, offset)


def table_rows(table: Tensor, length: int, offset: int) -> Tensor:
    """Rows offset .. offset+length-1 of a (max_len, D) positions table, which must hold them."""
    if offset < 0 or length < 0 or offset + length > table.size(0):
        raise ValueError(
            f"positions {offset} to {offset + length - 1} are outside the table of "
            f"{table.size(0)} positions (max_len)"
        )
    return table[offset : offset + length]


class Embeddings(nn.Module):
    """Token embedding + positional encoding, then dropout."""

    def __init__(
        self,
        token: TokenEmbedding,
        positions: SinusoidalPositions | LearnedPositions,
        dropout: float,
        max_len: int,
    ) -> None:
        super().__init__()
        self.token = token
        self.positions = positions
        self.dropout = nn.Dropout(dropout)
        self.max_len = max_len

    def forward(self, ids: Tensor, offset: int = 0) -> Tensor:
        """ids (B, L), first position `offset` -> (B, L, D)."""
        length = ids.size(1)
        self.check_length(offset + length)
        return self.dropout(self.token(ids) + self.positions(length, offset))

    def check_length(self, length: int) -> None:
        if length > self.max_len:
            raise ValueError(
                f"sequence of {length} positions exceeds the model's max_len ({self.max_len})"
            )


def make_embeddings(
    vocab_size: int,
    d_model: int,
    pad_id: int,
    dropout: float,
    max_len: int,
    positions: str,
    token: TokenEmbedding | None = None,
) -> Embeddings:
    """Build `Embeddings`, optionally around an existing (shared) token table."""
    token = token or TokenEmbedding(vocab_size, d_model, pad_id)
    table = SinusoidalPositions if positions == "sinusoidal" else LearnedPositions
    return Embeddings(token, table(max_len, d_model), dropout, max_len)
