"""The feed-forward network's Linear -> ReLU -> dropout as one step each way, for CPU training:
oneDNN applies the ReLU, the hashed dropout makes one pass. The backward is grad * where(out >
0, scale, 0) (kept and positive exactly where the output is), so only the output is stored.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from qkv.fast import dropout as hashed
from qkv.fast import linear as onednn
from qkv.fast.compiled import compiled
from qkv.model.layers import FeedForward


def applies(x: Tensor, weight: Tensor, bias: Tensor | None, p: float) -> bool:
    """Whether `linear_relu_dropout` takes its fused way for x (..., D) and weight (F, D)."""
    if not (torch.is_grad_enabled() and onednn.applies(x, weight, bias)):
        return False
    if not 0 < hashed.dropped_levels(p) < hashed._LEVELS:
        return False
    hidden = x.new_empty(()).expand(x.numel() // x.size(-1) * weight.size(0))  # no memory
    return hashed._hashed_applies(hidden) and _mask_kernel() is not None


def linear_relu_dropout(x: Tensor, weight: Tensor, bias: Tensor | None, p: float) -> Tensor:
    """dropout(relu(x Wᵀ + b), p) for x (..., D), weight (F, D) -> (..., F), where `applies`."""
    levels = hashed.dropped_levels(p)
    out: Tensor = _LinearReluDropout.apply(x, weight, bias, levels, hashed._scale(levels))
    return out


class _LinearReluDropout(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, levels: int, scale: float
    ) -> Tensor:
        rows = onednn._padded(x.reshape(-1, x.size(-1)))  # (M', D)
        hidden = onednn.onednn_linear(rows, weight, bias, "relu")  # (M', F)
        out = hashed._hashed(hidden, hashed._draw_seed(), levels, scale)  # (M', F)
        ctx.save_for_backward(rows, weight, out)
        ctx.has_bias, ctx.shape, ctx.scale = bias is not None, x.shape, scale
        count = x.numel() // x.size(-1)
        return out[:count].view(*x.shape[:-1], weight.size(0))  # (..., F)

    @staticmethod
    def backward(
        ctx: Any, grad: Tensor
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None, None, None]:
        rows, weight, out = ctx.saved_tensors  # (M', D), (F, D), (M', F)
        padded = onednn._padded(grad.reshape(-1, grad.size(-1)))  # (M', F), zeros below the M rows
        kernel = _mask_kernel()
        assert kernel is not None  # `applies` checked
        product_grad = kernel(padded, out, ctx.scale)  # (M', F)
        return *onednn._grads(product_grad, rows, weight, ctx), None, None


def relu_dropout_grad(grad: Tensor, out: Tensor, scale: float) -> Tensor:
    """The gradient of the product under ReLU and dropout: grad where out > 0, times scale."""
    return grad * torch.where(out > 0, scale, 0.0)


@functools.cache
def _mask_kernel() -> Callable[..., Any] | None:
    """`relu_dropout_grad` compiled (see `qkv.fast.compiled`), or None where it cannot be."""
    grad, out = (torch.zeros(hashed.HASHED_MIN // 1024, 1024) for _ in range(2))
    return compiled(relu_dropout_grad, grad, out, 1.0)


class FusedFeedForward(FeedForward):
    """`FeedForward` whose first half is `linear_relu_dropout` in training, where it applies."""

    def forward(self, x: Tensor) -> Tensor:
        first, p = self.linear1, self.dropout.p
        relu = isinstance(self.activation, nn.ReLU)
        if self.training and relu and applies(x, first.weight, first.bias, p):
            return self.linear2(linear_relu_dropout(x, first.weight, first.bias, p))  # (..., D)
        return super().forward(x)
