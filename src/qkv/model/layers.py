"""Feed-forward network and the encoder and decoder layers ("Add & Norm" around each sub-layer).

Post-norm, as in the paper: x = norm(x + dropout(sublayer(x))).
Pre-norm, an option that trains more stably when deep: x = x + dropout(sublayer(norm(x))).

Everything but attention works position by position, so a layer takes either a padded batch
x (B, L, D) or only its real tokens x (M, D) with the `Packing` that places them (`packing.py`).
"""

from __future__ import annotations

from torch import Tensor, nn

from qkv.model import fused_ffn
from qkv.model.attention import MultiHeadAttention
from qkv.model.dropout import Dropout
from qkv.model.frozen_linear import FrozenLinear
from qkv.model.kv_cache import SelfAttentionCache
from qkv.model.linear import Linear
from qkv.model.packing import Packing


class FeedForward(nn.Module):
    """Position-wise feed-forward network: Linear(D, F) -> activation -> dropout -> Linear(F, D)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str = "relu"):
        super().__init__()
        self.linear1 = Linear(d_model, d_ff)
        self.activation = nn.GELU() if activation == "gelu" else nn.ReLU()
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        """x (..., D) -> (..., D), position by position."""
        first, relu, p = self.linear1, isinstance(self.activation, nn.ReLU), self.dropout.p
        if isinstance(first, FrozenLinear) and relu:  # decoding: the ReLU applied by oneDNN
            return self.linear2(self.dropout(first(x, relu=True)))  # (..., D)
        if self.training and relu and fused_ffn.applies(x, first.weight, first.bias, p):
            # the first linear layer, ReLU and dropout as one step each way (`fused_ffn.py`)
            return self.linear2(fused_ffn.linear_relu_dropout(x, first.weight, first.bias, p))
        return self.linear2(self.dropout(self.activation(first(x))))  # (..., D)


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
        self.dropout = Dropout(dropout)
        self.norm_first = norm_first

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None,
        need_weights: bool = False,
        rows: Packing | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, S, D), mask (B, 1, 1, S) -> (B, S, D) and weights (B, H, S, S) or None.

        With `rows`, x holds the real tokens only, (M, D), and so does the output; no weights.
        """
        if self.norm_first:
            h = self.self_attn_norm(x)
            attended, weights = self._self_attend(h, mask, need_weights, rows)
            x = x + self.dropout(attended)
            x = x + self.dropout(self.ffn(self.ffn_norm(x)))
        else:
            attended, weights = self._self_attend(x, mask, need_weights, rows)
            x = self.self_attn_norm(x + self.dropout(attended))
            x = self.ffn_norm(x + self.dropout(self.ffn(x)))
        return x, weights

    def _self_attend(
        self, x: Tensor, mask: Tensor | None, need_weights: bool, rows: Packing | None
    ) -> tuple[Tensor, Tensor | None]:
        if rows is None:
            return self.self_attn(x, x, x, mask, need_weights)
        return self.self_attn.forward_packed(x, x, mask, rows, rows), None


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
        self.dropout = Dropout(dropout)
        self.norm_first = norm_first

    def forward(
        self,
        x: Tensor,
        memory: Tensor | tuple[Tensor, Tensor],
        self_mask: Tensor | None,
        cross_mask: Tensor | None,
        need_weights: bool = False,
        cache: SelfAttentionCache | None = None,
        rows: Packing | None = None,
        memory_rows: Packing | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """One decoder layer.

        Args:
            x: target states (B, T, D), or the real target tokens only (M, D) placed by `rows`.
            memory: encoder output (B, S, D) or its real tokens (M', D) placed by
                `memory_rows`, or its cross-attention keys and values (G, H, S, K) each,
                computed once per source during incremental decoding (see `DecoderCache`).
            self_mask: (B, 1, T, T) causal & padding mask, or None when decoding with a cache
                (broadcastable to (N, 1, 1, T_max) with a `StaticKVCache`).
            cross_mask: (B, 1, 1, S) source padding mask.
            cache: this layer's self-attention cache (incremental decoding): a `KVCache`, or a
                `StaticKVCache` whose whole buffer is attended to under `self_mask`.
            rows, memory_rows: given together, for packed x and memory.

        Returns:
            (B, T, D) (or (M, D) when packed), self-attention weights (B, H, T, T') and cross
            weights (B, H, T, S), the weights None unless `need_weights`.
        """
        if self.norm_first:
            h = self.self_attn_norm(x)
            attended, self_weights = self._self_attend(h, self_mask, need_weights, cache, rows)
            x = x + self.dropout(attended)
            crossed, cross_weights = self._cross(
                self.cross_attn_norm(x), memory, cross_mask, need_weights, rows, memory_rows
            )
            x = x + self.dropout(crossed)
            x = x + self.dropout(self.ffn(self.ffn_norm(x)))
        else:
            attended, self_weights = self._self_attend(x, self_mask, need_weights, cache, rows)
            x = self.self_attn_norm(x + self.dropout(attended))
            crossed, cross_weights = self._cross(
                x, memory, cross_mask, need_weights, rows, memory_rows
            )
            x = self.cross_attn_norm(x + self.dropout(crossed))
            x = self.ffn_norm(x + self.dropout(self.ffn(x)))
        return x, self_weights, cross_weights

    def step(
        self,
        x: Tensor,
        cache: SelfAttentionCache,
        keys: Tensor,
        values: Tensor,
        source_bias: Tensor,
        guard: bool,
    ) -> Tensor:
        """`forward` for one new position per row, over the caches of incremental decoding
        (`DecoderCache`): the same numbers, by the shortest way (no masks, weights or checks).

        Args:
            x: (N, 1, D) the newest position of each row.
            cache: this layer's self-attention cache.
            keys, values: cross-attention's (G, H, S, K) each, for G groups of rows.
            source_bias, guard: the source mask as `MultiHeadAttention.attend_source` takes it.

        Returns:
            (N, 1, D).
        """
        self_attn, cross_attn = self.self_attn, self.cross_attn
        # Decoding runs in eval mode, where dropout is the identity: not even a module call.
        dropout = self.dropout if self.training else _unchanged
        if self.norm_first:
            x = x + dropout(self_attn.attend_cache(self.self_attn_norm(x), cache))
            crossed = cross_attn.attend_source(
                self.cross_attn_norm(x), keys, values, source_bias, guard
            )
            x = x + dropout(crossed)
            return x + dropout(self.ffn(self.ffn_norm(x)))
        x = self.self_attn_norm(x + dropout(self_attn.attend_cache(x, cache)))
        crossed = cross_attn.attend_source(x, keys, values, source_bias, guard)
        x = self.cross_attn_norm(x + dropout(crossed))
        return self.ffn_norm(x + dropout(self.ffn(x)))

    def _self_attend(
        self,
        x: Tensor,
        mask: Tensor | None,
        need_weights: bool,
        cache: SelfAttentionCache | None,
        rows: Packing | None,
    ) -> tuple[Tensor, Tensor | None]:
        if rows is None:
            return self.self_attn(x, x, x, mask, need_weights, cache)
        return self.self_attn.forward_packed(x, x, mask, rows, rows), None

    def _cross(
        self,
        x: Tensor,
        memory: Tensor | tuple[Tensor, Tensor],
        mask: Tensor | None,
        need_weights: bool,
        rows: Packing | None,
        memory_rows: Packing | None,
    ) -> tuple[Tensor, Tensor | None]:
        if isinstance(memory, Tensor):
            if rows is not None and memory_rows is not None:
                return self.cross_attn.forward_packed(x, memory, mask, rows, memory_rows), None
            return self.cross_attn(x, memory, memory, mask, need_weights)
        keys, values = memory  # (G, H, S, K) each, precomputed for G groups of rows
        # The rows of a group (N = G * W) decode one source: they attend as W query positions.
        n_rows, _, d_model = x.shape  # N, 1, D
        queries = x.reshape(keys.size(0), -1, d_model)  # (G, W, D)
        out, weights = self.cross_attn.attend(
            self.cross_attn.project_q(queries), keys, values, mask, need_weights, incremental=True
        )  # (G, W, D), (G, H, W, S)
        if weights is not None:
            weights = weights.transpose(1, 2).reshape(n_rows, -1, 1, weights.size(-1))
        return out.reshape(x.shape), weights  # (N, 1, D), (N, H, 1, S)


def _unchanged(x: Tensor) -> Tensor:
    return x
