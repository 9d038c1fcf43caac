"""Decoding steps at fixed shapes, recorded once as a CUDA graph and replayed: on a GPU,
launching a small model's kernels from Python takes longer than running them.

A graph replays the same kernels on the same memory, so a step reads R = B * W rows, all T_max
positions of the self-attention cache (masked) and a copy of the cross-attention keys and
values per row. The searches run between replays; `select` moves rows between the buffers.
Shapes: B batch, N rows in use, R rows in all, V vocabulary, H heads, K head size, S source.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor

from qkv.fast.graphs import record
from qkv.inference.incremental import DecodingWeights, ModelDecoder
from qkv.inference.search import IncrementalDecoder
from qkv.model.kv_cache import SourceKV, move_rows
from qkv.model.layers import DecoderLayer
from qkv.model.seq2seq import Seq2SeqTransformer


class StaticKVCache:
    """Keys and values (R, H, T_max, K) of one self-attention layer, written at `position`
    (1,) long, shared by all layers. Unwritten positions hold zeros, masked out."""

    def __init__(self, shape: tuple[int, ...], position: Tensor, dtype: torch.dtype) -> None:
        self.keys = torch.zeros(shape, dtype=dtype, device=position.device)
        self.values = torch.zeros_like(self.keys)
        self.position = position

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the step's keys/values (R, H, 1, K) at `position`; return all (R, H, T_max, K)."""
        self.keys.index_copy_(2, self.position, k.to(self.keys.dtype))
        self.values.index_copy_(2, self.position, v.to(self.values.dtype))
        return self.keys, self.values


@dataclass
class StaticDecoderCache:
    """Everything a decoding step reads, at fixed shapes: per decoder layer a `StaticKVCache`
    and cross keys and values (R, H, S, K); `length` counts the steps decoded, on the host."""

    self_attn: list[StaticKVCache]
    cross_keys: list[Tensor]
    cross_values: list[Tensor]
    src_mask: Tensor  # (R, 1, 1, S)
    position: Tensor  # (1,) long, the step being decoded
    steps: Tensor  # (T_max,) 0, 1, ..., made once
    length: int = 0

    @property
    def capacity(self) -> int:
        return self.self_attn[0].keys.size(2)

    @property
    def rows(self) -> int:
        return self.src_mask.size(0)

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
    (B, S, D): row i < B decodes source i, the rows beyond hold copies of source 0 until
    `select` fills them."""
    c = model.config
    batch, device = memory.size(0), memory.device
    if rows < batch:
        raise ValueError(f"a static cache needs rows >= batch, got {rows} < {batch}")
    if max_len > c.max_len:
        raise ValueError(f"{max_len} decoding steps exceed the model's max_len ({c.max_len})")
    fill = torch.arange(rows, device=device)  # (R,) the source of each row
    fill[batch:] = 0
    position = torch.zeros(1, dtype=torch.long, device=device)  # (1,)
    layers = cast(Iterable[DecoderLayer], model.decoder.layers)
    cross = [layer.cross_attn.project_kv(memory) for layer in layers]  # (B, H, S, K) each
    shape = (rows, c.n_heads, max_len, c.d_model // c.n_heads)
    return StaticDecoderCache(
        self_attn=[StaticKVCache(shape, position, memory.dtype) for _ in cross],
        cross_keys=[k.contiguous()[fill] for k, _ in cross],  # (R, H, S, K)
        cross_values=[v.contiguous()[fill] for _, v in cross],  # (R, H, S, K)
        src_mask=src_mask[fill],  # (R, 1, 1, S)
        position=position,
        steps=torch.arange(max_len, device=device),  # (T_max,)
    )


def static_step(model: Seq2SeqTransformer, tokens: Tensor, cache: StaticDecoderCache) -> Tensor:
    """tokens (R,) fed at `cache.position` -> next-token logits (R, V): the reference
    decoder's layers over the fixed-shape cache, nothing read on the host."""
    decoder, embeddings = model.decoder, model.decoder.embeddings
    position = embeddings.positions(cache.capacity).index_select(0, cache.position)  # (1, D)
    x = embeddings.dropout(embeddings.token(tokens[:, None]) + position)  # (R, 1, D)
    self_mask = (cache.steps <= cache.position).view(1, 1, 1, -1)  # (1, 1, 1, T_max) written
    layers = zip(decoder.layers, cache.self_attn, cache.cross_keys, cache.cross_values, strict=True)
    for layer, grown, keys, values in layers:
        x, _, _ = layer(x, x, self_mask, cache.src_mask, cache=(grown, SourceKV(keys, values)))
    return model.output(decoder.final_norm(x)[:, 0])  # (R, V)


class StaticDecoder:
    """The search functions' decoder over a `StaticDecoderCache` of `rows` rows and
    `max_steps` steps, one graph replay per step: with `graph` (None: on a CUDA device), the
    step is recorded at the first `step`; without, it runs eagerly (same numbers)."""

    def __init__(
        self,
        model: Seq2SeqTransformer,
        src_ids: Tensor,
        max_steps: int,
        rows: int,
        graph: bool | None = None,
    ) -> None:
        self.model = model
        memory, src_mask, _ = model.encode(src_ids)  # (B, S, D), (B, 1, 1, S)
        self.cache = init_static_cache(model, memory, src_mask, max_steps, rows)
        self.tokens = torch.zeros(rows, dtype=torch.long, device=src_ids.device)  # (R,)
        self.use_graph = src_ids.device.type == "cuda" if graph is None else graph
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits = torch.empty(0)  # (R, V) where the graph leaves its output

    def compute(self) -> Tensor:
        """The fixed-shape step, recordable as a graph: float32 logits (R, V) of `tokens`."""
        return static_step(self.model, self.tokens, self.cache).float()  # (R, V)

    def step(self, tokens: Tensor) -> Tensor:
        """tokens (N,) -> next-token logits (N, V), in float32."""
        count, cache = tokens.numel(), self.cache
        if cache.length >= cache.capacity:
            raise RuntimeError(f"decoder full: {cache.capacity} steps were allowed")
        self.tokens[:count].copy_(tokens)
        cache.position.fill_(cache.length)
        if not self.use_graph:
            logits = self.compute()[:count]  # (N, V), rows of a new tensor
        else:
            if self.graph is None:  # the warm-ups compute this very step: harmless
                self.graph, self.logits = record(self.compute, self.tokens.device)
            self.graph.replay()
            logits = self.logits[:count].clone()  # (N, V), a copy: the next replay overwrites
        cache.length += 1
        return logits

    def select(self, rows: Tensor, held: Tensor | None = None) -> None:
        """Keep and reorder rows: new row i = old row rows[i] (at most R rows)."""
        self.cache.select(rows)


def make_decoder(
    model: Seq2SeqTransformer,
    src_ids: Tensor,
    max_steps: int,
    rows: int,
    cuda_graphs: bool = True,
    weights: DecodingWeights | None = None,
) -> IncrementalDecoder:
    """The fastest decoder for the device: a `StaticDecoder` on a GPU (unless `cuda_graphs`
    is False), else a `ModelDecoder` sharing the frozen `weights`."""
    if cuda_graphs and src_ids.device.type == "cuda":
        return StaticDecoder(model, src_ids, max_steps, rows)
    return ModelDecoder(model, src_ids, max_steps, weights=weights)
