"""What recording CUDA graphs needs in every part of the package."""

from __future__ import annotations

import torch

_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream on which work runs eagerly before a capture, one per device.

    A graph's first run must happen outside the capture (lazy initialisation), on a stream
    other than the capturing one. Each new stream gets a cuBLAS workspace of its own that
    is never freed, so a stream per graph would hold tens of MB per graph.
    """
    if device not in _STREAMS:
        _STREAMS[device] = torch.cuda.Stream(device)
    return _STREAMS[device]
