"""The optimiser: AdamW, with torch's fused kernel where it has one for the device."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

FUSED_DEVICES = ("cpu", "cuda")  # one pass over weights, gradients and moments (not foreach's)


def adamw(
    params: Iterable[nn.Parameter],
    device: torch.device,
    lr: float,
    betas: tuple[float, float],
    eps: float = 1e-8,
    weight_decay: float = 0.0,
) -> torch.optim.AdamW:
    """AdamW over `params` on `device`: fused on CPUs and CUDA GPUs, `foreach` elsewhere (a
    resumed run keeps the kernel of the run that saved it: its parameter groups say)."""
    fused = device.type in FUSED_DEVICES
    return torch.optim.AdamW(
        params,
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        foreach=None if fused else True,
        fused=fused or None,
    )
