"""Linear layers whose float32 products go to oneDNN on the CPU, forward and backward.

`F.linear` hands a CPU float32 product to the BLAS that torch was built with (MKL). On CPUs
where MKL does not use the widest vector units (AMD's, where it takes its AVX2 code), oneDNN,
which torch also ships, multiplies about twice as fast: on this project's benchmark machine
(AMD EPYC, AVX-512) 420-440 against 185-190 GFLOP/s at the shapes of a training step. Here
each of a step's three products runs there: y = x Wᵀ + b, the input's gradient g W, and the
weight's gradient gᵀ x (`_weight_grad`), over row counts rounded up to a few shapes
(`_padded`). Whole training steps of the benchmark model were 1.47-1.51× as fast as with
`F.linear` (`benchmarks/train_ab.py --change linear`). The numbers are those of `F.linear` up
to float rounding (tested).

Where it does not apply (a GPU, another dtype, autocast, a torch built without oneDNN, an
empty batch), `linear` is `F.linear`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.fast.compiled import allowed, compiled


class Linear(nn.Linear):
    """`nn.Linear` (same parameters, same state dict) computed by `linear`."""

    def forward(self, x: Tensor) -> Tensor:
        """x (..., in) -> (..., out)."""
        return linear(x, self.weight, self.bias)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x (..., in), weight (out, in), bias (out,) -> x Wᵀ + b (..., out), as `F.linear`."""
    if not applies(x, weight, bias):
        return F.linear(x, weight, bias)
    out: Tensor = _OneDNNLinear.apply(x, weight, bias)
    return out


class _OneDNNLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        rows = _padded(x.reshape(-1, x.size(-1)))  # (M', in)
        ctx.save_for_backward(rows, weight)  # the padded rows, for the weight's gradient
        ctx.has_bias, ctx.shape = bias is not None, x.shape
        out = _product(rows, weight, bias)[: x.numel() // x.size(-1)]  # (M, out)
        return out.view(*x.shape[:-1], weight.size(0))  # (..., out)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        inputs, weight = ctx.saved_tensors  # (M', in), (out, in)
        padded = _padded(grad.reshape(-1, grad.size(-1)))  # (M', out)
        return _grads(padded, inputs, weight, ctx)


def _grads(
    grad: Tensor, inputs: Tensor, weight: Tensor, ctx: Any
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The gradients of a product's input, weight and bias, those `ctx` asks for.

    Args:
        grad: the product's gradient at the padded rows (M', out), zeros below the M real ones.
        inputs: the padded rows the forward multiplied (M', in); weight: (out, in).
        ctx: an autograd context with `needs_input_grad` (input, weight, bias first), `shape`
            (the input's) and `has_bias`.
    """
    grad_x = grad_w = grad_b = None
    if ctx.needs_input_grad[0]:
        count = ctx.shape.numel() // ctx.shape[-1]
        grad_x = _product(grad, _as_input_grad_weight(weight))[:count].view(ctx.shape)
    if ctx.needs_input_grad[1]:
        grad_w = _weight_grad(grad, inputs)  # (out, in)
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_b = grad.sum(dim=0)  # (out,); the padding rows add zeros
    return grad_x, grad_w, grad_b


WIDE = 2048
"""Outputs from which the input's gradient multiplies by a transposed copy of the weight."""


def _as_input_grad_weight(weight: Tensor) -> Tensor:
    """weight (out, in) -> its transpose (in, out), oneDNN's weight operand for g W.

    A transposed view costs nothing, and is the faster operand up to a few hundred outputs;
    from `WIDE` outputs (an output layer's vocabulary) oneDNN multiplies faster by a
    contiguous copy, made in a compiled loop (`transposed`): the input's gradient of 2,048
    rows ran 1.06-1.20x as fast at 2,048 to 16,000 outputs of 256, the copy included, and
    0.78-0.94x as fast at 256 to 1,024 outputs.
    """
    kernel = _transpose_kernel_for(weight) if weight.size(0) >= WIDE else None
    if kernel is None:
        return weight.t()  # (in, out), a view
    copy: Tensor = kernel(weight)  # (in, out)
    return copy


def _weight_grad(grad: Tensor, inputs: Tensor) -> Tensor:
    """grad (M, out), inputs (M, in) -> gradᵀ inputs (out, in).

    oneDNN reads its weight operand (n, k) in either layout at full speed, so one factor goes
    in as a transposed view; its source operand (m, k) it reads transposed slowly when it is
    wide, so the narrower factor is the one copied into the (·, M) layout (`transposed`).
    Copying the wider factor, the product comes out as (in, out), and is transposed in turn:
    autograd would copy a transposed view into the weight's own layout anyway, more slowly.
    """
    if grad.size(1) > inputs.size(1):
        return transposed(_product(transposed(inputs), grad.t()))  # (out, in)
    return _product(transposed(grad), inputs.t())  # (out, in)


def transposed(rows: Tensor) -> Tensor:
    """rows (M, k) -> its transpose (k, M), contiguous.

    Eager torch copies a transposed view element by element, about a third as fast as the loop
    inductor tiles for it (0.23 against 0.07 ms at 2,048 rows of 256); the compiled loop is
    taken where compiled loops are allowed and work (`qkv.fast.compiled`).
    """
    kernel = _transpose_kernel_for(rows)
    if kernel is None:
        return rows.t().contiguous()
    out: Tensor = kernel(rows)
    return out


def _transpose_kernel_for(rows: Tensor) -> Callable[..., Any] | None:
    """The compiled transpose for `rows`, or None: not on a CPU, compiled loops not allowed,
    or not working here."""
    return _transpose_kernel() if allowed() and rows.device.type == "cpu" else None


def _transpose(rows: Tensor) -> Tensor:
    return rows.t().clone(memory_format=torch.contiguous_format)


@functools.cache
def _transpose_kernel() -> Callable[..., Any] | None:
    """`_transpose` compiled for any sizes (see `qkv.fast.compiled`), or None where it cannot be."""
    return compiled(_transpose, torch.zeros(1032, 384))


STEPS_PER_DOUBLING = 16
"""How many row counts `padded_rows` keeps per doubling: at most 1/16 more rows, zeros."""


def padded_rows(count: int) -> int:
    """count rounded up to one of `STEPS_PER_DOUBLING` steps per doubling, a multiple of 8.

    oneDNN makes a kernel and buffers for each new shape and keeps some of them: training's
    packed batches, a new row count at every step, grew the benchmark's training phase to
    3.8 GB, against 1.4 GB with `F.linear`. Rounded up, the shapes repeat. Finer steps spend
    fewer products on padding rows and keep more kernels: at 8 steps per doubling the
    benchmark's sources took 5.1 % more rows than they have, at 16 steps 2.3 %, and whole
    training steps ran 1.009x as fast on its batches, 1.017x on qkv's bucketed ones
    (`benchmarks/train_ab.py --change rounding`), for 4 % more peak memory in a Multi30k run.
    32 steps gained about 1 % more, for 14 % more memory.
    """
    doubling = 1 << max(count.bit_length() - 1, 0)  # the power of 2 at or below count
    step = max(8, doubling // STEPS_PER_DOUBLING)
    return -(-count // step) * step


def _padded(rows: Tensor) -> Tensor:
    """rows (M, k) -> (M', k), zeros below the M rows, M' = `padded_rows(M)`.

    A caller that hands in M' rows already (`nonpad_logits` does, for the output layer, whose
    gradient is the widest) saves the copies.
    """
    count = len(rows)
    target = padded_rows(count)
    if target == count and rows.is_contiguous():
        return rows
    padded = rows.new_empty(target, rows.size(1))  # (M', k)
    padded[:count] = rows
    padded[count:] = 0.0
    return padded


def _product(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str = "none"
) -> Tensor:
    """x (m, k) times weight (n, k) transposed, plus bias (n,), in oneDNN -> (m, n); with
    `activation` "relu", the ReLU applied as the product is written."""
    out: Tensor = torch.ops.mkldnn._linear_pointwise(x, weight, bias, activation, [], "")
    return out


def applies(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """Whether `linear` goes to oneDNN for these operands."""
    return (
        x.device.type == "cpu"
        and x.dtype == weight.dtype == torch.float32
        and (bias is None or bias.dtype == torch.float32)
        and x.dim() >= 2
        and x.numel() > 0
        and torch.backends.mkldnn.is_available()
        and not torch.is_autocast_enabled("cpu")
    )
