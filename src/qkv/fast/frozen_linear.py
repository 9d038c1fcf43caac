"""Linear layers frozen for CPU decoding: weights reordered once for oneDNN's blocked layout,
as `torch.compile` does to frozen CPU linears; elsewhere the layer is `linear`."""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Collection
from typing import TypeVar

import torch
from torch import Tensor, nn

from qkv.fast.linear import (
    cpu_info,
    linear,
    onednn_available,
    onednn_linear,
    onednn_multiplies,
    reorder_for_onednn,
)

_Module = TypeVar("_Module", bound=nn.Module)

ROWS_HINT = 64  # the rows a product that oneDNN lays the weights out for
MIN_ROWS = 8  # fewer rows a call: the layer's own product is faster for a decoder's layers


class FrozenLinear(nn.Module):
    """`linear` for inference, its weight reordered for oneDNN at the first call that can use
    it, one of at least `min_rows` rows: make a new layer after the weights change."""

    def __init__(self, linear: nn.Linear, min_rows: int = MIN_ROWS) -> None:
        super().__init__()
        self.linear, self.min_rows = linear, min_rows
        # False: the layer as it is, always (also where oneDNN's linear operator is missing)
        self.reorders = _applies(linear.weight) and onednn_available()
        self.blocked: Tensor | None = None  # made at the first call that uses it
        self.bias = None if linear.bias is None else linear.bias.detach()
        self._parts: dict[tuple[int, int], FrozenLinear] = {}

    @property
    def weight(self) -> Tensor:
        """The layer's own (out, in) weight, for code that slices it."""
        return self.linear.weight

    def forward(self, x: Tensor, relu: bool = False) -> Tensor:
        """x (..., in) -> (..., out); with `relu`, followed by a ReLU."""
        inference = not (torch.is_grad_enabled() or torch.is_autocast_enabled("cpu"))
        if x.is_cpu and inference and x.numel() >= self.min_rows * x.size(-1):
            blocked = self._blocked()
            if blocked is not None and x.dtype == blocked.dtype:
                activation = "relu" if relu else "none"
                return onednn_linear(x, blocked, self.bias, activation)
        out = linear(x, self.linear.weight, self.linear.bias)  # (..., out)
        return torch.relu(out) if relu else out

    def part(self, start: int, stop: int) -> FrozenLinear:
        """The layer of output rows [start, stop) of this one, frozen in turn; made once."""
        if (start, stop) not in self._parts:
            bias = None if self.bias is None else self.bias[start:stop]
            linear = as_linear(self.weight.detach()[start:stop], bias)
            self._parts[start, stop] = FrozenLinear(linear, self.min_rows)
        return self._parts[start, stop]

    def _blocked(self) -> Tensor | None:
        """The reordered weight, made now if not yet; None where it cannot be."""
        if self.blocked is None and self.reorders:
            try:
                weight = self.linear.weight.detach()
                self.blocked = reorder_for_onednn(weight, ROWS_HINT)
            except (AttributeError, RuntimeError):  # a torch without the operator
                self.reorders = False
        return self.blocked


def frozen_copy(module: _Module, keep: Collection[str] = ()) -> _Module:
    """A copy of `module` sharing its parameters, buffers and settings, in which every
    `nn.Linear` below it is a `FrozenLinear`, except under the children named in `keep`
    (shared as they are)."""
    kept = [child for name, child in module.named_children() if name in keep]
    shared = [*module.parameters(), *module.buffers(), *kept]
    twin = copy.deepcopy(module, {id(t): t for t in shared})
    _freeze(twin, {id(child) for child in kept})
    return twin


def _freeze(module: nn.Module, kept: set[int]) -> None:
    """Every `nn.Linear` below `module` made a `FrozenLinear`, except under modules in `kept`."""
    for name, child in module.named_children():
        if id(child) in kept:
            continue
        if isinstance(child, nn.Linear):
            setattr(module, name, FrozenLinear(child))
        else:
            _freeze(child, kept)


def as_linear(weight: Tensor, bias: Tensor | None = None) -> nn.Linear:
    """An `nn.Linear` around `weight` (out, in) and `bias` (out,), without copying them."""
    layer = nn.Linear(1, 1, bias=bias is not None, device="meta")  # its parameters replaced
    layer.in_features, layer.out_features = weight.size(1), weight.size(0)
    layer.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        layer.bias = nn.Parameter(bias, requires_grad=False)
    return layer


def _applies(t: Tensor) -> bool:
    return (
        t.device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and (t.dtype == torch.float32 or (t.dtype == torch.bfloat16 and cpu_bf16_matmuls()))
        and not torch.is_autocast_enabled("cpu")
    )


@functools.cache
def cpu_bf16_matmuls() -> bool:
    """Whether this CPU multiplies bf16 matrices natively through oneDNN: oneDNN also takes
    them where it only emulates them, slower than float32, so /proc/cpuinfo must show
    AVX512-BF16 or AMX-BF16, and a small bf16 product in oneDNN must come out right."""
    return onednn_available() and _bf16_instructions() and onednn_multiplies(torch.bfloat16)


def _bf16_instructions() -> bool:
    return re.search(r"\b(avx512_bf16|amx_bf16)\b", cpu_info()) is not None
