"""Decoding steps at fixed shapes, recorded once as a CUDA graph and replayed.

On a GPU, a decoding step of a small model is a few hundred kernels of a few microseconds each,
and launching them from Python takes longer than running them: the GPU waits for the host.
A CUDA graph records the kernels of one step once and replays them with a single launch. A
graph replays the same kernels on the same memory, so everything a step reads must keep its
shape and address from step to step:

- the rows: R = B * W of them from the start (W the beam width), whether or not in use;
- the self-attention cache: every step attends to all T_max positions, those not yet decoded
  masked out, and writes its keys and values at a position held in a tensor;
- the cross-attention keys and values: one copy per row (`StaticDecoderCache`).

The search loops stay as they are (`search.py`, `beam.py`): they feed the N rows in use, read
their logits and call `select`, which moves rows between the fixed buffers. Rows beyond N are
computed for nothing; on a GPU that costs less than a launch.

Shapes follow the package alphabet (see `qkv.model`): B batch, N rows in use, R rows in all,
V vocabulary size.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor

from qkv.graphs import side_stream
from qkv.inference.incremental import ModelDecoder
from qkv.inference.search import IncrementalDecoder
from qkv.model.seq2seq import Seq2SeqTransformer


class StaticDecoder:
    """The search functions' decoder over a `StaticDecoderCache`, one graph replay per step.

    Args:
        model: the translation model, in eval mode.
        src_ids: source ids (B, S).
        max_steps: the most tokens any row will be fed (BOS included), at most the model's
            max_len.
        rows: R, the most rows the search will hold at once (B * beam width), at least B.
        graph: record the step as a CUDA graph; None records one on a CUDA device only.
            Without a graph the same fixed-shape step runs eagerly (same numbers).
    """

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
        self.cache = model.init_static_cache(memory, src_mask, max_steps, rows)
        self.tokens = torch.zeros(rows, dtype=torch.long, device=src_ids.device)  # (R,)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits = torch.empty(0)  # (R, V) where the graph leaves its output
        if graph is None:
            graph = src_ids.device.type == "cuda"
        if graph:
            self._record()

    def _forward(self) -> Tensor:
        return self.model.decode_step(self.tokens, self.cache).float()  # (R, V)

    def _record(self) -> None:
        """Warm up on a side stream, then record one step (the warm-up writes at position 0,
        which the first real step overwrites before anything reads it)."""
        stream = side_stream(self.tokens.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), _uncached_autocast():
            for _ in range(2):
                self._forward()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), _uncached_autocast():
            self.logits = self._forward()

    def step(self, tokens: Tensor) -> Tensor:
        """tokens (N,) -> next-token logits (N, V), in float32."""
        count, cache = tokens.numel(), self.cache
        if cache.length >= cache.capacity:
            raise RuntimeError(f"decoder full: {cache.capacity} steps were allowed")
        self.tokens[:count].copy_(tokens)
        cache.position.fill_(cache.length)
        if self.graph is None:
            logits = self._forward()[:count]  # (N, V), rows of a new tensor
        else:
            self.graph.replay()
            logits = self.logits[:count].clone()  # (N, V), a copy: the next replay overwrites
        cache.length += 1
        return logits

    def select(self, rows: Tensor) -> None:
        """Keep and reorder rows: new row i = old row rows[i] (at most R rows)."""
        self.cache.select(rows)


def make_decoder(
    model: Seq2SeqTransformer,
    src_ids: Tensor,
    max_steps: int,
    rows: int,
    cuda_graphs: bool = True,
) -> IncrementalDecoder:
    """The fastest decoder for the device: CUDA graphs on a GPU, `ModelDecoder` elsewhere.

    Args:
        model: the translation model, in eval mode.
        src_ids: source ids (B, S).
        max_steps: the most tokens any row will be fed (BOS included).
        rows: the most rows the search will hold at once (B * beam width).
        cuda_graphs: False decodes eagerly on a GPU too.
    """
    if cuda_graphs and src_ids.device.type == "cuda":
        return StaticDecoder(model, src_ids, max_steps, rows)
    return ModelDecoder(model, src_ids, max_steps)


def _uncached_autocast() -> contextlib.AbstractContextManager[Any]:
    """The caller's CUDA autocast, if any, without its cache of cast weights: a graph must not
    keep pointers to casts that the cache frees when the outer autocast ends."""
    if not torch.is_autocast_enabled("cuda"):
        return contextlib.nullcontext()
    dtype = torch.get_autocast_dtype("cuda")
    return torch.autocast("cuda", dtype=dtype, cache_enabled=False)
