"""The label-smoothed cross-entropy of a CPU training step as one compiled loop each way, where
it pays for its compiling (`applies`): the forward reads each row of the (M, V) logits once and
keeps its log-sum-exp, the backward writes (softmax - smoothed target) * grad in one pass.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from qkv.fast.compiled import allowed, compiled

MIN_ELEMENTS = 1 << 22  # logits in a step below which the eager loss is cheaper than compiling


def applies(logits: Tensor) -> bool:
    """Whether the compiled loss is worth its compiling for these logits (M, V), and works."""
    return (
        logits.device.type == "cpu"
        and logits.dtype == torch.float32
        and logits.dim() == 2
        and logits.numel() >= MIN_ELEMENTS
        and logits.requires_grad
        and torch.is_grad_enabled()
        and allowed()
        and _forward_kernel() is not None
    )


def smoothed_cross_entropy(
    logits: Tensor, labels: Tensor, smoothing: float, ignore_index: int
) -> Tensor:
    """Summed label-smoothed cross-entropy, as `F.cross_entropy(..., reduction="sum")`, where
    `applies`: logits (M, V) float32, labels (M,) -> scalar; `ignore_index` rows add nothing."""
    loss: Tensor = _FusedLoss.apply(logits, labels, smoothing, ignore_index)
    return loss


class _FusedLoss(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        logits: Tensor,
        labels: Tensor,
        smoothing: float,
        ignore_index: int,
    ) -> Tensor:
        kernel = _forward_kernel()
        assert kernel is not None  # `applies` checked
        loss, lse = kernel(logits, labels, smoothing, ignore_index)
        ctx.save_for_backward(logits, labels, lse)
        ctx.smoothing, ctx.ignore_index = smoothing, ignore_index
        return loss

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        logits, labels, lse = ctx.saved_tensors  # the logits need a gradient: `applies`
        args = (logits, labels, lse, grad, ctx.smoothing, ctx.ignore_index)
        kernel = _grad_kernel()
        grad_logits = kernel(*args) if kernel is not None else _grad(*args)
        return grad_logits, None, None, None


def _example() -> tuple[Tensor, Tensor, Tensor]:
    """Logits (64, 2048), labels (64,) and their log-sum-exp (64, 1) to compile on, from a
    generator of their own (see `qkv.fast.compiled`)."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 2048, generator=generator)  # (M, V)
    labels = torch.randint(0, 2048, (64,), generator=generator)  # (M,)
    return logits, labels, torch.logsumexp(logits, 1, keepdim=True)


@functools.cache
def _forward_kernel() -> Callable[..., Any] | None:
    """`_loss_and_lse` compiled for any M and V, or None where it cannot be."""
    logits, labels, _ = _example()
    return compiled(_loss_and_lse, logits, labels, 0.1, 0)


@functools.cache
def _grad_kernel() -> Callable[..., Any] | None:
    """`_grad` compiled for any M and V (at the first backward), or None."""
    return compiled(_grad, *_example(), torch.tensor(1.0), 0.1, 0)


def _loss_and_lse(
    logits: Tensor, labels: Tensor, smoothing: float, ignore_index: int
) -> tuple[Tensor, Tensor]:
    """logits (M, V), labels (M,) -> summed smoothed loss (), log-sum-exp (M, 1).

    A row's loss: (1 − ε)(lse − x_label) + ε(lse − mean x) = lse − (1 − ε) x_label − ε mean x.
    """
    kept = (labels != ignore_index)[:, None]  # (M, 1)
    label = torch.where(kept, labels[:, None], 0)  # (M, 1), in range
    top = logits.amax(1, keepdim=True)  # (M, 1)
    lse = (logits - top).exp().sum(1, keepdim=True).log() + top  # (M, 1)
    mean = logits.sum(1, keepdim=True) / logits.size(1)  # (M, 1)
    rows = lse - (1.0 - smoothing) * logits.gather(1, label) - smoothing * mean  # (M, 1)
    return torch.where(kept, rows, 0.0).sum(), lse


def _grad(
    logits: Tensor, labels: Tensor, lse: Tensor, grad: Tensor, smoothing: float, ignore_index: int
) -> Tensor:
    """The logits' gradient (M, V): (softmax − smoothed target) × grad, 0 on ignored rows."""
    kept = (labels != ignore_index)[:, None]  # (M, 1)
    hit = torch.arange(logits.size(1), device=logits.device) == labels[:, None]  # (M, V)
    uniform = smoothing / logits.size(1)
    target = torch.where(hit, 1.0 - smoothing + uniform, uniform)  # (M, V)
    return torch.where(kept, ((logits - lse).exp() - target) * grad, 0.0)
