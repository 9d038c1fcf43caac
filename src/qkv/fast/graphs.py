"""Recording CUDA graphs: the shared side stream, warm-up runs and autocast without cache."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

import torch

# One stream a device for every warm-up and capture of the package: each new stream gets a
# cuBLAS workspace that is never freed.
_STREAMS: dict[torch.device, torch.cuda.Stream] = {}
T = TypeVar("T")


def record(
    compute: Callable[[], T], device: torch.device, pool: Any = None, warmups: int = 2
) -> tuple[torch.cuda.CUDAGraph, T]:
    """Record `compute` as a CUDA graph: (the graph, the tensors its recording returned, which
    every replay overwrites). `compute` first runs `warmups` times eagerly, outside a capture.
    With `pool` (another graph's `pool()`), the graphs share memory: they must replay one at a
    time and keep nothing in the pool between replays."""
    if device not in _STREAMS:
        _STREAMS[device] = torch.cuda.Stream(device)
    stream, current = _STREAMS[device], torch.cuda.current_stream(device)
    stream.wait_stream(current)  # after the current stream's earlier work, before its later
    try:
        with torch.cuda.stream(stream), _uncached_autocast():
            for _ in range(warmups):
                compute()
    finally:
        current.wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream), _uncached_autocast():
        result = compute()
    return graph, result


def _uncached_autocast() -> contextlib.AbstractContextManager[Any]:
    """The caller's CUDA autocast, if any, without its cache of cast weights: a graph must not
    keep pointers to casts that the cache frees when the outer autocast ends."""
    if not torch.is_autocast_enabled("cuda"):
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), cache_enabled=False)
