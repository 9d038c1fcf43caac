"""Feed-forward network and the encoder and decoder layers ("Add & Norm" around each sub-layer).

Post-norm, as in the paper: x = norm(x + dropout(sublayer(x))).
Pre-norm, an option that trains more stably when deep: x = x + dropout(sublayer(norm(x))).
"""

from __future__ import annotations

from torch import Tensor, nn

from qkv.model.attention import MultiHeadAttention
from qkv.model.kv_cache import KVCache


class FeedForward(nn.Module):
    """Position-wise feed-forward network: Linear(D, F) -> activation -> dropout -> Linear(F, D)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str = "relu"):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.activation = nn.GELU() if activation == "gelu" else nn.ReLU()
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, L, D) -> (B, L, D)."""
        return self.linear2(self.dropout(self.activation(self.linear1(x))))  # (B, L, D)


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
        memory: Tensor | tuple[Tensor, Tensor],
        self_mask: Tensor | None,
        cross_mask: Tensor | None,
        need_weights: bool = False,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """One decoder layer.

        Args:
            x: target states (B, T, D).
            memory: encoder output (B, S, D), or its cross-attention keys and values
                (B, H, S, K) each, computed once per source during incremental decoding.
            self_mask: (B, 1, T, T) causal & padding mask, or None when decoding with a cache.
            cross_mask: (B, 1, 1, S) source padding mask.
            cache: this layer's self-attention KV cache (incremental decoding).

        Returns:
            (B, T, D), self-attention weights (B, H, T, T') and cross weights (B, H, T, S),
            the weights None unless `need_weights`.
        """
        if self.norm_first:
            h = self.self_attn_norm(x)
            attended, self_weights = self.self_attn(h, h, h, self_mask, need_weights, cache)
            x = x + self.dropout(attended)
            crossed, cross_weights = self._cross(
                self.cross_attn_norm(x), memory, cross_mask, need_weights
            )
            x = x + self.dropout(crossed)
            x = x + self.dropout(self.ffn(self.ffn_norm(x)))
        else:
            attended, self_weights = self.self_attn(x, x, x, self_mask, need_weights, cache)
            x = self.self_attn_norm(x + self.dropout(attended))
            crossed, cross_weights = self._cross(x, memory, cross_mask, need_weights)
            x = self.cross_attn_norm(x + self.dropout(crossed))
            x = self.ffn_norm(x + self.dropout(self.ffn(x)))
        return x, self_weights, cross_weights

    def _cross(
        self,
        x: Tensor,
        memory: Tensor | tuple[Tensor, Tensor],
        mask: Tensor | None,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        if isinstance(memory, Tensor):
            return self.cross_attn(x, memory, memory, mask, need_weights)
        keys, values = memory  # (B, H, S, K) each, precomputed
        return self.cross_attn.attend(
            self.cross_attn.project_q(x), keys, values, mask, need_weights
        )
