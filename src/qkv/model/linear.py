"""Linear layers whose float32 products go to oneDNN on the CPU, forward and backward.

`F.linear` hands a CPU float32 product to the BLAS that torch was built with (MKL). On CPUs
where MKL does not use the widest vector units (AMD's, where it takes its AVX2 code), oneDNN,
which torch also ships, multiplies about twice as fast: on this project's benchmark machine
(AMD EPYC, AVX-512) 420-440 against 185-190 GFLOP/s at the shapes of a training step. Here
each of a step's three products runs there: y = x Wᵀ + b, the input's gradient g W, and the
weight's gradient gᵀ x, over row counts rounded up to a few shapes (`_padded`). Whole training
steps of the benchmark model were 1.31× as fast (`benchmarks/linear_ab.py`). The numbers are
those of `F.linear` up to float rounding (tested).

Where it does not apply (a GPU, another dtype, autocast, a torch built without oneDNN, an
empty batch), `linear` is `F.linear`.
"""

from __future__ import annotations

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
    if not _applies(x, weight, bias):
        return F.linear(x, weight, bias)
    out: Tensor = _OneDNNLinear.apply(x, weight, bias)
    return out


class _OneDNNLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        rows = x.reshape(-1, x.size(-1))  # (M, in)
        out = _product(_padded(rows), weight, bias)[: len(rows)]  # (M, out)
        return out.view(*x.shape[:-1], weight.size(0))  # (..., out)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x, weight = ctx.saved_tensors
        rows = grad.reshape(-1, grad.size(-1))  # (M, out)
        padded = _padded(rows)  # (M', out)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _product(padded, weight.t().contiguous())[: len(rows)].view(x.shape)
        if ctx.needs_input_grad[1]:
            inputs = _padded(x.reshape(-1, x.size(-1)))  # (M', in)
            grad_w = _product(padded.t().contiguous(), inputs.t().contiguous())  # (out, in)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = rows.sum(dim=0)  # (out,)
        return grad_x, grad_w, grad_b


def _padded(rows: Tensor) -> Tensor:
    """rows (M, k) -> (M', k), zeros below the M rows: M rounded up to one of 8 steps per
    doubling (at most 1/8 more rows, and at least a multiple of 8).

    oneDNN makes a kernel and buffers for each new shape and keeps some of them: training's
    packed batches, a new row count at every step, grew the benchmark's training phase to
    3.8 GB, against 1.4 GB with `F.linear`. Rounded up, the shapes repeat (1.6 GB).
    """
    count = len(rows)
    step = max(8, 1 << max(count.bit_length() - 4, 0))
    target = -(-count // step) * step
    if target == count and rows.is_contiguous():
        return rows
    padded = rows.new_empty(target, rows.size(1))  # (M', k)
    padded[:count] = rows
    padded[count:] = 0.0
    return padded


def _product(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x (m, k) times weight (n, k) transposed, plus bias (n,), in oneDNN -> (m, n)."""
    out: Tensor = torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return out


def _applies(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    return (
        x.device.type == "cpu"
        and x.dtype == weight.dtype == torch.float32
        and (bias is None or bias.dtype == torch.float32)
        and x.dim() >= 2
        and x.numel() > 0
        and torch.backends.mkldnn.is_available()
        and not torch.is_autocast_enabled("cpu")
    )
