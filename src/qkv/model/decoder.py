"""The decoder stack: embeddings, N decoder layers, and a final norm when pre-norm."""

from __future__ import annotations

from torch import Tensor, nn

from qkv.model.config import ModelConfig
from qkv.model.embedding import Embeddings
from qkv.model.kv_cache import DecoderCache, StaticDecoderCache
from qkv.model.layers import DecoderLayer
from qkv.model.masks import check_mask
from qkv.model.packing import Packing


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
        self.pad_id = config.pad_id

    def forward(
        self,
        ids: Tensor,
        memory: Tensor,
        self_mask: Tensor,
        cross_mask: Tensor,
        need_weights: bool = False,
        packed: bool = True,
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """Decode a whole target sequence at once (training, scoring).

        Args:
            ids: target input ids (B, T); memory: (B, S, D);
            self_mask: (B, 1, T, T); cross_mask: (B, 1, 1, S).

        Returns:
            states (B, T, D), self-attention maps (B, H, T, T) and cross maps (B, H, T, S)
            per layer (empty unless `need_weights`). Packed and without weights, every layer
            runs on the real tokens only (target and source) and the states are zero at
            padding; otherwise on the padded batch (see `Encoder.forward`).

        Raises:
            TypeError: if a mask is not boolean.
        """
        check_mask(self_mask, "self_mask")
        check_mask(cross_mask, "cross_mask")
        if packed and not need_weights:
            return self._forward_packed(ids, memory, self_mask, cross_mask), [], []
        x = self.embeddings(ids)  # (B, T, D)
        self_maps: list[Tensor] = []
        cross_maps: list[Tensor] = []
        for layer in self.layers:
            x, self_weights, cross_weights = layer(x, memory, self_mask, cross_mask, need_weights)
            if self_weights is not None and cross_weights is not None:
                self_maps.append(self_weights)
                cross_maps.append(cross_weights)
        return self.final_norm(x), self_maps, cross_maps

    def _forward_packed(
        self, ids: Tensor, memory: Tensor, self_mask: Tensor, cross_mask: Tensor
    ) -> Tensor:
        """`forward` on the real tokens only -> states (B, T, D)."""
        batch, source_length = memory.shape[:2]
        on_cpu = ids.device.type == "cpu"  # rows rounded for the CPU's linear layers
        rows = Packing.from_mask(ids != self.pad_id, round_rows=on_cpu)
        source_real = cross_mask.expand(batch, 1, 1, source_length)[:, 0, 0]  # (B, S)
        memory_rows = Packing.from_mask(source_real, round_rows=on_cpu)
        memory = memory_rows.pack(memory)  # (M', D)
        x = self.embeddings.forward_packed(ids, rows)  # (M, D)
        for layer in self.layers:
            x, _, _ = layer(x, memory, self_mask, cross_mask, rows=rows, memory_rows=memory_rows)
        return rows.unpack(self.final_norm(x))  # (B, T, D)

    def cross_keys_values(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Each layer's cross-attention keys and values (B, H, S, K), computed once per source.

        Made contiguous here, once, so that every decoding step reads them as they lie.
        """
        pairs = [layer.cross_attn.project_kv(memory) for layer in self._layers()]
        return [(k.contiguous(), v.contiguous()) for k, v in pairs]

    def _layers(self) -> list[DecoderLayer]:
        return [layer for layer in self.layers if isinstance(layer, DecoderLayer)]

    def step(self, ids: Tensor, cache: DecoderCache | StaticDecoderCache) -> Tensor:
        """Decode the next position of every row, reusing the cache.

        Args:
            ids: the newest token of each row (N, 1).
            cache: a `DecoderCache`, or a `StaticDecoderCache` (fixed shapes, the position in
                a tensor: nothing here depends on the step on the host).

        Returns:
            states (N, 1, D); the cache grows by one position (a `StaticDecoderCache` is
            advanced by its owner).
        """
        layers, cross = self._layers(), (cache.cross_keys, cache.cross_values)
        if isinstance(cache, StaticDecoderCache):
            x = self.embeddings.at(ids, cache.position)  # (R, 1, D)
            self_mask = cache.self_mask()  # (1, 1, 1, T_max)
            for layer, static, keys, values in zip(layers, cache.self_attn, *cross, strict=True):
                x, _, _ = layer(x, (keys, values), self_mask, cache.src_mask, cache=static)
            return self.final_norm(x)  # (R, 1, D)
        x = self.embeddings(ids, offset=cache.length)  # (N, 1, D)
        bias, guard = cache.source_bias, cache.empty_sources
        for layer, grown, keys, values in zip(layers, cache.self_attn, *cross, strict=True):
            x = layer.step(x, grown, keys, values, bias, guard)  # (N, 1, D)
        return self.final_norm(x)  # (N, 1, D)
