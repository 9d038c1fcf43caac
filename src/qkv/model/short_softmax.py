"""Softmax over short rows, and its gradient, for attention's scores on the CPU.

torch's CPU softmax over the last dimension runs along each row a vector at a time; a row
shorter than one vector (16 floats with AVX-512) goes element by element, exp() included. On
the benchmark machine 3,400 rows of 15 took 0.31 ms and rows of 16 0.024 ms; the gradient
likewise (0.12 against 0.008 ms at the group shapes of a training step). Attention over short
sentences is made of such rows: a group's keys are as many as its longest sentence, and
Multi30k's sentences are 11-15 tokens long on average. So rows shorter than `SHORT_ROW` go to
compiled loops (`qkv.compiled`), which inductor vectorizes with masked loads; longer rows, and
everywhere compiled loops are not allowed or do not work, to torch's own kernels. So does a
forward that no backward follows (`training` false): decoding encodes each batch once, and the
compiler's machinery, once loaded, would add some 120 MB to a decoding process (peak RSS 503
against 386 MB in the benchmark's greedy phase). The numbers are those of torch's up to float
rounding (tested).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from qkv.compiled import allowed, compiled

SHORT_ROW = 16
"""Rows shorter than this go to the compiled loops."""


def softmax(scores: Tensor, training: bool) -> Tensor:
    """softmax(scores, dim=-1), scores (..., S); the compiled loop only where `training`: a
    backward follows. (Inside an autograd function's forward, grad mode is off: the caller
    says.)"""
    kernel = _forward_kernel() if training and _short(scores) else None
    if kernel is None:
        return torch.softmax(scores, dim=-1)
    weights: Tensor = kernel(scores)
    return weights


def softmax_backward(grad: Tensor, weights: Tensor, scale: float) -> Tensor:
    """The gradient of softmax's input, times `scale`, from its output's `grad` and its output
    `weights` (..., S): scale · weights ⊙ (grad − Σ_s grad ⊙ weights)."""
    kernel = _backward_kernel() if _short(weights) else None
    if kernel is None:
        out = torch._softmax_backward_data(grad, weights, -1, weights.dtype)
        return out.mul_(scale)
    grad_scores: Tensor = kernel(grad, weights, scale)
    return grad_scores


def _short(x: Tensor) -> bool:
    return (
        x.size(-1) < SHORT_ROW
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and x.numel() > 0
        and allowed()
    )


def _softmax(scores: Tensor) -> Tensor:
    return torch.softmax(scores, dim=-1)


def _softmax_grad(grad: Tensor, weights: Tensor, scale: float) -> Tensor:
    return weights * (grad - (grad * weights).sum(-1, keepdim=True)) * scale


def _example(rows: int = 1000, length: int = 13) -> Tensor:
    """Group-sized scores: inductor decides from the first sizes whether to use both cores.
    Drawn from a generator of their own: the global one is the training run's (resumed runs
    restore it; compiling at the first step must not draw from it)."""
    generator = torch.Generator().manual_seed(0)
    return torch.randn(rows // length, length, length - 1, generator=generator)


@functools.cache
def _forward_kernel() -> Callable[..., Any] | None:
    """`_softmax` compiled for any sizes, or None where it cannot be."""
    return compiled(_softmax, _example())


@functools.cache
def _backward_kernel() -> Callable[..., Any] | None:
    """`_softmax_grad` compiled for any sizes, or None where it cannot be."""
    scores = _example()
    return compiled(_softmax_grad, scores, torch.softmax(scores, dim=-1), 0.125)
