"""What recording CUDA graphs needs in every part of the package."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream on which work runs eagerly before a capture, and the capture itself,
    one per device.

    A graph's first run must happen outside the capture (lazy initialisation), on a stream
    other than the default one, and capturing needs a stream other than the default one too.
    Each new stream gets a cuBLAS workspace of its own that is never freed (32 MB on an
    H100), so every warm-up and every capture of the package runs on this one.
    """
    if device not in _STREAMS:
        _STREAMS[device] = torch.cuda.Stream(device)
    return _STREAMS[device]


@contextlib.contextmanager
def on_side_stream(device: torch.device) -> Iterator[None]:
    """Run the block's CUDA work on `side_stream(device)`, after the work queued on the current
    stream before it and before the work queued there after it; on a CPU, just run it.

    Decoding runs its eager work (encoding, the search's set-up) here as well as its recordings
    and replays, so that the default stream never needs a cuBLAS workspace of its own: with
    both, a GPU keeps two (64 MB on an H100) where one does.
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

    It runs `warmups` times eagerly on the side stream first (lazy initialisation must happen
    outside a capture), so those runs must be harmless or wanted: a decoding step that the
    first replay repeats, a search step whose state the caller then resets, a training step
    that is the shape's first real step. With `pool` (another graph's `pool()`), the graph's
    temporaries share that graph's memory: safe when the graphs replay one at a time and keep
    nothing in the pool between replays.
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
