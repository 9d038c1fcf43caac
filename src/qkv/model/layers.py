"""The position-wise feed-forward network and the encoder and decoder layers.

Each sub-layer is wrapped in "Add & Norm" (section 3.1 of the paper):
post-norm, as in the paper: x = norm(x + dropout(sublayer(x)));
pre-norm, an option that trains more stably when deep: x = x + dropout(sublayer(norm(x))).
"""

from __future__ import annotations

from torch import Tensor, nn

from qkv.model.attention import MultiHeadAttention
from qkv.model.kv_cache import SelfAttentionCache, SourceKV


class FeedForward(nn.Module):
    """FFN(x) = Linear(D, F) -> activation -> dropout -> Linear(F, D), position by position."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str = "relu"):
        super().__init__()
        if activation not in ("relu", "gelu"):
            raise ValueError(f"activation must be 'relu' or 'gelu', got {activation!r}")
        self.linear1 = nn.Linear(d_model, d_ff)
        self.activation = nn.GELU() if activation == "gelu" else nn.ReLU()
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        """x (..., D) -> (..., D)."""
        return self.linear2(self.dropout(self.activation(self.linear1(x))))  # (..., D)


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward, each wrapped in a residual connection and layer norm."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float,
        attention_dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.ffn = FeedForward(d_model, d_ff, dropout, activation)
        self.self_attn_norm = nn.LayerNorm(d_model)
        self.ffn_norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(
        self, x: Tensor, mask: Tensor | None, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, S, D), mask (B, 1, 1, S) -> (B, S, D) and weights (B, H, S, S) or None."""
        if self.norm_first:
            h = self.self_attn_norm(x)
            attended, weights = self.self_attn(h, h, h, mask, need_weights)
            x = x + self.dropout(attended)
            x = x + self.dropout(self.ffn(self.ffn_norm(x)))
        else:
            attended, weights = self.self_attn(x, x, x, mask, need_weights)
            x = self.self_attn_norm(x + self.dropout(attended))
            x = self.ffn_norm(x + self.dropout(self.ffn(x)))
        return x, weights


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder (cross) attention and feed-forward."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float,
        attention_dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.ffn = FeedForward(d_model, d_ff, dropout, activation)
        self.self_attn_norm = nn.LayerNorm(d_model)
        self.cross_attn_norm = nn.LayerNorm(d_model)
        self.ffn_norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        self_mask: Tensor | None,
        cross_mask: Tensor | None,
        need_weights: bool = False,
        cache: tuple[SelfAttentionCache, SourceKV] | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """One decoder layer.

        Args:
            x: target states (B, T, D).
            memory: encoder output (B, S, D); not read when decoding with a `cache`.
            self_mask: (B, 1, T, T) causal & padding mask; None when decoding with a cache.
            cross_mask: (B, 1, 1, S) source padding mask.
            cache: while decoding, this layer's self-attention cache and the source's
                cross-attention keys and values (see `DecoderCache`).

        Returns:
            (B, T, D), self-attention weights (B, H, T, T') and cross weights (B, H, T, S),
            the weights None unless `need_weights`.
        """
        self_cache, source = cache if cache is not None else (None, None)

        def self_attend(h: Tensor) -> tuple[Tensor, Tensor | None]:
            return self.self_attn(h, h, h, self_mask, need_weights, self_cache)

        def cross_attend(h: Tensor) -> tuple[Tensor, Tensor | None]:
            return self.cross_attn(h, memory, memory, cross_mask, need_weights, source)

        if self.norm_first:
            attended, self_weights = self_attend(self.self_attn_norm(x))
            x = x + self.dropout(attended)
            crossed, cross_weights = cross_attend(self.cross_attn_norm(x))
            x = x + self.dropout(crossed)
            x = x + self.dropout(self.ffn(self.ffn_norm(x)))
        else:
            attended, self_weights = self_attend(x)
            x = self.self_attn_norm(x + self.dropout(attended))
            crossed, cross_weights = cross_attend(x)
            x = self.cross_attn_norm(x + self.dropout(crossed))
            x = self.ffn_norm(x + self.dropout(self.ffn(x)))
        return x, self_weights, cross_weights
