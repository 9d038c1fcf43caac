"""Recording CUDA graphs: the shared side stream, warm-up runs and autocast without cache."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The stream, one per device, on which every warm-up and capture of the package runs.

    Warm-up runs (lazy initialisation outside the capture) and captures need a stream other
    than the default one, and each new stream gets a cuBLAS workspace that is never freed.
    """
    if device not in _STREAMS:
        _STREAMS[device] = torch.cuda.Stream(device)
    return _STREAMS[device]


@contextlib.contextmanager
def on_side_stream(device: torch.device) -> Iterator[None]:
    """Run the block's CUDA work on `side_stream(device)`, ordered after the current stream's
    earlier work and before its later work; on a CPU, just run the block.

    Decoding runs its eager work here as well as its recordings and replays, so that the
    default stream never needs a cuBLAS workspace of its own beside the side stream's.
    """
    if device.type != "cuda":
        yield
        return
    stream, current = side_stream(device), torch.cuda.current_stream(device)
    if stream == current:
        yield
        return
    stream.wait_stream(current)
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        current.wait_stream(stream)


T = TypeVar("T")


def record(
    compute: Callable[[], T], device: torch.device, pool: Any = None, warmups: int = 2
) -> tuple[torch.cuda.CUDAGraph, T]:
    """Record `compute` as a CUDA graph: (the graph, the tensors its recording returned, which
    every replay overwrites).

    `compute` first runs `warmups` times eagerly on the side stream (lazy initialisation must
    happen outside a capture), so those runs must be harmless or wanted: a decoding step that
    the first replay repeats, a training step that is the shape's first real step. With `pool`
    (another graph's `pool()`), the temporaries share that graph's memory: safe when the
    graphs replay one at a time and keep nothing in the pool between replays.
    """
    with on_side_stream(device), _uncached_autocast():
        for _ in range(warmups):
            compute()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=side_stream(device)), _uncached_autocast():
        result = compute()
    return graph, result


def _uncached_autocast() -> contextlib.AbstractContextManager[Any]:
    """The caller's CUDA autocast, if any, without its cache of cast weights: a graph must not
    keep pointers to casts that the cache frees when the outer autocast ends."""
    if not torch.is_autocast_enabled("cuda"):
        return contextlib.nullcontext()
    dtype = torch.get_autocast_dtype("cuda")
    return torch.autocast("cuda", dtype=dtype, cache_enabled=False)
