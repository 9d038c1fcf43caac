"""The decoder stack: embeddings, N decoder layers, and a final norm when pre-norm."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from torch import Tensor, nn

from qkv.model.config import ModelConfig
from qkv.model.embedding import Embeddings
from qkv.model.kv_cache import DecoderCache, KVCache, SourceKV
from qkv.model.layers import DecoderLayer
from qkv.model.masks import check_mask


class Decoder(nn.Module):
    """N identical layers of masked self-attention, cross-attention and feed-forward."""

    def __init__(self, config: ModelConfig, embeddings: Embeddings) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.layers = nn.ModuleList(
            DecoderLayer(
                config.d_model,
                config.n_heads,
                config.d_ff,
                config.dropout,
                config.attention_dropout,
                config.activation,
                config.norm_first,
            )
            for _ in range(config.n_decoder_layers)
        )
        self.final_norm = nn.LayerNorm(config.d_model) if config.norm_first else nn.Identity()
        self.n_heads, self.pad_id = config.n_heads, config.pad_id

    def forward(
        self,
        ids: Tensor,
        memory: Tensor,
        self_mask: Tensor,
        cross_mask: Tensor,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """Decode a whole target sequence at once (training, scoring).

        Args:
            ids: target input ids (B, T); memory: (B, S, D);
            self_mask: (B, 1, T, T); cross_mask: (B, 1, 1, S).

        Returns:
            states (B, T, D), self-attention maps (B, H, T, T) and cross maps (B, H, T, S)
            per layer (empty unless `need_weights`).

        Raises:
            TypeError: if a mask is not boolean.
        """
        check_mask(self_mask, "self_mask")
        check_mask(cross_mask, "cross_mask")
        x = self.embeddings(ids)  # (B, T, D)
        self_maps: list[Tensor] = []
        cross_maps: list[Tensor] = []
        for layer in self.layers:
            x, self_weights, cross_weights = layer(x, memory, self_mask, cross_mask, need_weights)
            if self_weights is not None and cross_weights is not None:
                self_maps.append(self_weights)
                cross_maps.append(cross_weights)
        return self.final_norm(x), self_maps, cross_maps

    def init_cache(self, memory: Tensor, src_mask: Tensor, max_len: int) -> DecoderCache:
        """A cache for decoding up to `max_len` steps from memory (N, S, D): each layer's
        cross-attention keys and values are computed here, once per source."""
        rows, heads = memory.size(0), self.n_heads
        head_dim = memory.size(2) // heads
        self_attn, source = [], []
        for layer in cast(Iterable[DecoderLayer], self.layers):
            keys, values = layer.cross_attn.project_kv(memory)  # (N, H, S, K) each
            source.append(SourceKV(keys.contiguous(), values.contiguous()))
            self_attn.append(KVCache(rows, heads, head_dim, max_len, memory.dtype, memory.device))
        return DecoderCache(self_attn, source, src_mask)

    def step(self, ids: Tensor, cache: DecoderCache) -> Tensor:
        """Decode the next position of every row, reusing the cache.

        Args:
            ids: the newest token of each row (N, 1).

        Returns:
            states (N, 1, D); the cache grows by one position.
        """
        x = self.embeddings(ids, offset=cache.length)  # (N, 1, D)
        for layer, grown, source in zip(self.layers, cache.self_attn, cache.source, strict=True):
            x, _, _ = layer(x, x, None, cache.src_mask, cache=(grown, source))  # (N, 1, D)
        return self.final_norm(x)  # (N, 1, D)
