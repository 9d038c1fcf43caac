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

The search loops of `search.py` and `beam.py` work with it as they are: they feed the N rows in
use, read their logits and call `select`, which moves rows between the fixed buffers. Rows
beyond N are computed for nothing; on a GPU that costs less than a launch. The searches are
the same functions on every device: only the model's step is recorded.

Shapes follow the package alphabet (see `qkv.model`): B batch, N rows in use, R rows in all,
V vocabulary size.
"""

from __future__ import annotations

import torch
from torch import Tensor

from qkv.fast.graphs import record
from qkv.fast.static_cache import init_static_cache, static_step
from qkv.inference.incremental import DecodingWeights, ModelDecoder
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
        graph: replay the step as a CUDA graph, recorded at the first `step`; None: on a
            CUDA device only. Without a graph the same fixed-shape step runs eagerly (same
            numbers).
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
        self.cache = init_static_cache(model, memory, src_mask, max_steps, rows)
        self.tokens = torch.zeros(rows, dtype=torch.long, device=src_ids.device)  # (R,)
        self.use_graph = src_ids.device.type == "cuda" if graph is None else graph
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits = torch.empty(0)  # (R, V) where the graph leaves its output

    @property
    def rows(self) -> int:
        """R, the rows computed at every step."""
        return self.tokens.numel()

    def compute(self) -> Tensor:
        """The fixed-shape step itself: next-token logits (R, V) in float32 of every row, fed
        `tokens` at `cache.position`. Nothing here waits for the device or moves the host's
        count, so it can be recorded as a graph."""
        return static_step(self.model, self.tokens, self.cache).float()  # (R, V)

    def step(self, tokens: Tensor) -> Tensor:
        """tokens (N,) -> next-token logits (N, V), in float32. With a graph, the first call
        records `compute` and every call replays it."""
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
        """Keep and reorder rows: new row i = old row rows[i] (at most R rows); `held` is not
        used."""
        self.cache.select(rows)


def make_decoder(
    model: Seq2SeqTransformer,
    src_ids: Tensor,
    max_steps: int,
    rows: int,
    cuda_graphs: bool = True,
    weights: DecodingWeights | None = None,
) -> IncrementalDecoder:
    """The fastest decoder for the device: CUDA graphs on a GPU, `ModelDecoder` elsewhere.

    Args:
        model: the translation model, in eval mode.
        src_ids: source ids (B, S).
        max_steps: the most tokens any row will be fed (BOS included).
        rows: the most rows the search will hold at once (B * beam width).
        cuda_graphs: False decodes eagerly on a GPU too.
        weights: the model's `DecodingWeights`, shared by the `ModelDecoder`s of many batches.
    """
    if cuda_graphs and src_ids.device.type == "cuda":
        return StaticDecoder(model, src_ids, max_steps, rows)
    return ModelDecoder(model, src_ids, max_steps, weights=weights)
