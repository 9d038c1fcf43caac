"""The decoder's caches at fixed shapes, for decoding steps recorded once as CUDA graphs.

`StaticDecoderCache` holds what `qkv.model.kv_cache.DecoderCache` holds, in tensors whose
shapes, step position included, never change, so a whole decoding step can be recorded once
and replayed (`qkv.inference.graphed`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import cast

import torch
from torch import Tensor

from qkv.model.kv_cache import SourceKV, move_rows
from qkv.model.layers import DecoderLayer
from qkv.model.seq2seq import Seq2SeqTransformer


def first_sources(batch: int, rows: int, device: torch.device) -> Tensor:
    """(R,) long, the source of each row of a fresh fixed-shape cache: row i < B decodes source
    i, the rows beyond hold copies of source 0 until `select` fills them."""
    return torch.cat([torch.arange(batch), torch.zeros(rows - batch, dtype=torch.long)]).to(device)


class StaticKVCache:
    """Keys and values of one self-attention layer at fixed shapes: every step reads all T_max.

    A step writes its keys and values at `position` (a tensor) and attends to the whole buffer
    under `StaticDecoderCache.self_mask`; the buffers start at zero, so unwritten positions hold
    finite numbers (their weights are exactly zero).

    Args:
        rows: R, the most rows decoded together.
        n_heads, head_dim: H and K.
        max_len: T_max, the most steps.
        position: (1,) long, the step being decoded, shared by all layers.
    """

    def __init__(
        self,
        rows: int,
        n_heads: int,
        head_dim: int,
        max_len: int,
        position: Tensor,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        shape = (rows, n_heads, max_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=position.device)  # (R, H, T_max, K)
        self.values = torch.zeros(shape, dtype=dtype, device=position.device)  # (R, H, T_max, K)
        self.position = position

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the step's keys/values (R, H, 1, K) at `position`; return all (R, H, T_max, K)."""
        self.keys.index_copy_(2, self.position, k.to(self.keys.dtype))
        self.values.index_copy_(2, self.position, v.to(self.values.dtype))
        return self.keys, self.values


@dataclass
class StaticDecoderCache:
    """Everything a decoding step reads, at shapes fixed for the whole batch.

    R rows, each with its own entry of the cross-attention tensors (each of a sentence's W beams
    holds a copy). Rows beyond those in use hold stale numbers and are computed for nothing;
    `select` moves rows as `DecoderCache.select` does.

    Attributes:
        self_attn: one StaticKVCache per decoder layer.
        cross_keys, cross_values: one (R, H, S, K) tensor per decoder layer.
        src_mask: (R, 1, 1, S) bool, True = real source token.
        position: (1,) long, the step being decoded (0 for the first token fed).
        length: the number of steps decoded so far, as a Python int (the host's count).
    """

    self_attn: list[StaticKVCache]
    cross_keys: list[Tensor]
    cross_values: list[Tensor]
    src_mask: Tensor
    position: Tensor
    length: int = 0
    steps: Tensor = field(init=False, repr=False)  # (T_max,) 0, 1, ..., made once

    def __post_init__(self) -> None:
        self.steps = torch.arange(self.capacity, device=self.position.device)

    @property
    def capacity(self) -> int:
        return self.self_attn[0].keys.size(2)

    @property
    def rows(self) -> int:
        return self.src_mask.size(0)

    def self_mask(self) -> Tensor:
        """(1, 1, 1, T_max) bool: the positions written so far, this step's included."""
        return (self.steps <= self.position).view(1, 1, 1, -1)

    def select(self, rows: Tensor) -> None:
        """Keep and reorder rows: new row i = old row rows[i] (rows (N',) long, N' <= R)."""
        if rows.numel() > self.rows:
            raise RuntimeError(f"{rows.numel()} rows asked of a cache made for {self.rows}")
        filled = [
            buffer[:, :, : self.length]
            for cache in self.self_attn
            for buffer in (cache.keys, cache.values)
        ]  # (R, H, length, K) each
        move_rows([*filled, *self.cross_keys, *self.cross_values, self.src_mask], rows)


def init_static_cache(
    model: Seq2SeqTransformer, memory: Tensor, src_mask: Tensor, max_len: int, rows: int
) -> StaticDecoderCache:
    """A fixed-shape cache for `rows` rows (>= B) decoding up to `max_len` steps from memory
    (B, S, D), its rows' sources as `first_sources` gives them."""
    c = model.config
    batch = memory.size(0)
    if rows < batch:
        raise ValueError(f"a static cache needs rows >= batch, got {rows} < {batch}")
    if max_len > c.max_len:
        raise ValueError(f"{max_len} decoding steps exceed the model's max_len ({c.max_len})")
    fill = first_sources(batch, rows, memory.device)  # (R,) the source of each row
    position = torch.zeros(1, dtype=torch.long, device=memory.device)  # (1,)
    cross = cross_keys_values(model, memory)  # (B, H, S, K) each
    head_dim = c.d_model // c.n_heads
    return StaticDecoderCache(
        self_attn=[
            StaticKVCache(rows, c.n_heads, head_dim, max_len, position, memory.dtype)
            for _ in model.decoder.layers
        ],
        cross_keys=[k[fill] for k, _ in cross],  # (R, H, S, K)
        cross_values=[v[fill] for _, v in cross],  # (R, H, S, K)
        src_mask=src_mask[fill],  # (R, 1, 1, S)
        position=position,
    )


def cross_keys_values(model: Seq2SeqTransformer, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
    """Each decoder layer's cross-attention keys and values (B, H, S, K) of memory (B, S, D)."""
    layers = cast(Iterable[DecoderLayer], model.decoder.layers)
    pairs = [layer.cross_attn.project_kv(memory) for layer in layers]
    return [(k.contiguous(), v.contiguous()) for k, v in pairs]


def static_step(model: Seq2SeqTransformer, tokens: Tensor, cache: StaticDecoderCache) -> Tensor:
    """tokens (R,) fed at `cache.position` -> next-token logits (R, V): the reference
    decoder's layers over the fixed-shape cache, nothing read on the host."""
    decoder, embeddings = model.decoder, model.decoder.embeddings
    position = embeddings.positions(cache.capacity).index_select(0, cache.position)  # (1, D)
    x = embeddings.dropout(embeddings.token(tokens[:, None]) + position)  # (R, 1, D)
    self_mask = cache.self_mask()  # (1, 1, 1, T_max)
    layers = zip(decoder.layers, cache.self_attn, cache.cross_keys, cache.cross_values, strict=True)
    for layer, grown, keys, values in layers:
        x, _, _ = layer(x, x, self_mask, cache.src_mask, cache=(grown, SourceKV(keys, values)))
    return model.output(decoder.final_norm(x)[:, 0])  # (R, V)
