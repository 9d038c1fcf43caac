"""Linear layers whose float32 CPU products go to oneDNN, forward and backward, on CPUs where
`F.linear`'s MKL does not take its best code (AMD's: MKL runs its AVX2 code there); on Intel's,
MKL is the faster (`preferred`). Row counts are rounded up to a few shapes (`_padded`).
"""

from __future__ import annotations

import functools
import platform
import re
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Linear(nn.Linear):
    """`nn.Linear` (same parameters, same state dict) computed by `linear`."""

    def forward(self, x: Tensor) -> Tensor:
        """x (..., in) -> (..., out)."""
        return linear(x, self.weight, self.bias)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x (..., in), weight (out, in), bias (out,) -> x Wᵀ + b (..., out), as `F.linear`."""
    if not applies(x, weight, bias):
        return F.linear(x, weight, bias)
    return _OneDNNLinear.apply(x, weight, bias)


class _OneDNNLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        rows = _padded(x.reshape(-1, x.size(-1)))  # (M', in)
        ctx.save_for_backward(rows, weight)  # the padded rows, for the weight's gradient
        ctx.shape = x.shape
        out = onednn_linear(rows, weight, bias)[: x.numel() // x.size(-1)]  # (M, out)
        return out.view(*x.shape[:-1], weight.size(0))  # (..., out)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """The gradients asked for, from the product's gradient padded to (M', out) with zeros
        below the M real rows, and the padded inputs (M', in)."""
        inputs, weight = ctx.saved_tensors  # (M', in), (out, in)
        grad = _padded(grad.reshape(-1, grad.size(-1)))  # (M', out)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            count = ctx.shape.numel() // ctx.shape[-1]
            grad_x = onednn_linear(grad, weight.t())[:count].view(ctx.shape)
        if ctx.needs_input_grad[1]:
            grad_w = _weight_grad(grad, inputs)  # (out, in)
        if ctx.needs_input_grad[2]:  # False without a bias
            grad_b = grad.sum(dim=0)  # (out,); the padding rows add zeros
        return grad_x, grad_w, grad_b


def _weight_grad(grad: Tensor, inputs: Tensor) -> Tensor:
    """grad (M, out), inputs (M, in) -> gradᵀ inputs (out, in); the narrower factor is copied
    as the source: oneDNN reads a transposed weight operand fast, a transposed source slowly."""
    if grad.size(1) > inputs.size(1):
        return onednn_linear(inputs.t().contiguous(), grad.t()).t().contiguous()  # (out, in)
    return onednn_linear(grad.t().contiguous(), inputs.t())  # (out, in)


STEPS_PER_DOUBLING = 16  # row counts `padded_rows` keeps per doubling: at most 1/16 more


def padded_rows(count: int) -> int:
    """count rounded up to one of `STEPS_PER_DOUBLING` steps per doubling, a multiple of 8:
    oneDNN keeps a kernel and buffers for each new shape, so the shapes must repeat."""
    doubling = 1 << max(count.bit_length() - 1, 0)  # the power of 2 at or below count
    step = max(8, doubling // STEPS_PER_DOUBLING)
    return -(-count // step) * step


def _padded(rows: Tensor) -> Tensor:
    """rows (M, k) -> (M', k), zeros below the M rows, M' = `padded_rows(M)` (uncopied where
    contiguous rows number M' already)."""
    count = len(rows)
    target = padded_rows(count)
    if target == count:
        return rows.contiguous()
    return F.pad(rows, (0, 0, 0, target - count))  # (M', k)


def onednn_linear(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str = "none"
) -> Tensor:
    """x (..., k) Wᵀ + b in oneDNN -> (..., n), for weight (n, k) or the blocked weight made by
    `reorder_for_onednn`; `activation` "relu" applies a ReLU as it writes the product. The one
    call of oneDNN's private linear operator: callers check `onednn_available` first."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, activation, [], "")


def reorder_for_onednn(weight: Tensor, rows: int) -> Tensor:
    """weight (n, k) in oneDNN's blocked layout for products of about `rows` rows, for
    `onednn_linear`; oneDNN's private operator, so callers check `onednn_available` first."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows)


def applies(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """Whether `linear` goes to oneDNN for these operands."""
    return (
        x.device.type == "cpu"
        and onednn_available()
        and x.dtype == weight.dtype == torch.float32
        and (bias is None or bias.dtype == torch.float32)
        and x.dim() >= 2
        and x.numel() > 0
        and not torch.is_autocast_enabled("cpu")
        and preferred()
    )


@functools.cache
def preferred() -> bool:
    """Whether oneDNN's products are the ones to train with here: not on an Intel CPU, where
    MKL's own code multiplies as fast or faster (the weight's gradient twice as fast, with no
    transposed copies), and only where oneDNN's operator is there (`onednn_available`)."""
    return onednn_available() and "intel" not in cpu_vendor().lower()


def cpu_vendor() -> str:
    """The CPU's vendor ("GenuineIntel", "AuthenticAMD", ...), or the platform's processor
    name where /proc/cpuinfo does not say."""
    found = re.search(r"^vendor_id\s*:\s*(\S+)", cpu_info(), re.M)
    return found.group(1) if found else platform.processor()


@functools.cache
def cpu_info() -> str:
    """The text of /proc/cpuinfo (Linux's description of the CPU: vendor, instruction sets),
    read once; "" where it cannot be read."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


@functools.cache
def onednn_available() -> bool:
    """Whether oneDNN's private `_linear_pointwise` operator is there and multiplies right."""
    return torch.backends.mkldnn.is_available() and onednn_multiplies(torch.float32)


def onednn_multiplies(dtype: torch.dtype) -> bool:
    """Whether a small product of `dtype` matrices through `onednn_linear` runs and equals
    `F.linear`'s (False where the operator is missing or refuses the dtype)."""
    x, weight = torch.ones(8, 4, dtype=dtype), torch.full((3, 4), 0.5, dtype=dtype)
    try:
        return torch.equal(onednn_linear(x, weight), F.linear(x, weight))
    except (AttributeError, RuntimeError):
        return False
