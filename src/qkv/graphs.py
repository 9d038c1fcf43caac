"""What recording CUDA graphs needs in every part of the package."""

from __future__ import annotations

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
