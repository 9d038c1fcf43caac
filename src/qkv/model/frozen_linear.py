"""A linear layer frozen for decoding on the CPU: its weight reordered once, used many times.

Decoding multiplies the same output weight (V, D) by a few dozen or hundred rows at every
step. oneDNN can reorder that weight once into its blocked layout, which its matmul then
streams faster than the row-major one (greedy and beam-5 decoding of the benchmark model are
about 4 % faster; bf16 decoding about 5 %). This is what `torch.compile` does to frozen CPU
linears; the two operators are called here directly, eagerly. Where they do not apply (a GPU, a
dtype other than float32 or bf16, bf16 on a CPU without native bf16 matmuls, autocast,
autograd, a torch built without oneDNN), the layer is used as it is.
The numbers are those of `nn.Linear` up to float rounding (tested).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class FrozenLinear:
    """`linear` for inference, with its weight reordered for oneDNN when that applies.

    The weight is copied when this is made: make a new one after the weights change.

    Args:
        linear: the layer, (out, in) weight.
        rows: the usual number of rows per call (a hint for the layout).
    """

    def __init__(self, linear: nn.Linear, rows: int) -> None:
        self.linear = linear
        self.blocked: Tensor | None = None
        weight = linear.weight
        if _applies(weight):
            try:
                self.blocked = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows)
            except (AttributeError, RuntimeError):  # a torch without the operator
                self.blocked = None
        self.bias = None if linear.bias is None else linear.bias.detach()

    def __call__(self, x: Tensor) -> Tensor:
        """x (..., in) -> (..., out)."""
        if self.blocked is None or not _applies(x) or torch.is_grad_enabled():
            return F.linear(x, self.linear.weight, self.linear.bias)  # (..., out)
        return torch.ops.mkldnn._linear_pointwise(x, self.blocked, self.bias, "none", [], "")


def _applies(t: Tensor) -> bool:
    return (
        t.device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and (t.dtype == torch.float32 or (t.dtype == torch.bfloat16 and cpu_bf16_matmuls()))
        and not torch.is_autocast_enabled("cpu")
    )


def cpu_bf16_matmuls() -> bool:
    """Whether this CPU multiplies bf16 matrices natively through oneDNN (AVX512-BF16, AMX)."""
    return torch.backends.mkldnn.is_available() and bool(
        torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )
