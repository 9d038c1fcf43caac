"""Dropout whose random masks are cheap to draw on the CPU.

Each 64-bit random word gives four 16-bit integers, dropped below a threshold (p rounded to a
multiple of 1/65536). On the CPU, for at least `HASHED_MIN` elements, word j is SplitMix64's
output j from one seed: a compiled loop draws and applies the mask, and the backward recomputes
it. Elsewhere the words come from torch's generator.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from qkv.fast.compiled import allowed, compiled

_LEVELS = 1 << 16  # values of a 16-bit slice
HASHED_MIN = 1 << 18  # elements from which the CPU's masks are hashed in a compiled loop

# SplitMix64 (Steele, Lea and Flood, 2014): increment and mixing multipliers, as int64 values
_GAMMA = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)


def drop_mask(shape: torch.Size, p: float, device: torch.device | None = None) -> Tensor:
    """A bool tensor of `shape`, True (drop) with probability round(p * 65536) / 65536."""
    return _slices(shape, device) < _threshold(p)


def dropped_levels(p: float) -> int:
    """How many of the 65536 slice values mean "drop"."""
    return round(p * _LEVELS)


def dropout(x: Tensor, p: float) -> Tensor:
    """Zero each element with probability p and scale the rest by 1 / (1 - p)."""
    levels = dropped_levels(p)
    if levels == 0:
        return x
    if levels == _LEVELS:
        return x * 0.0
    scale = _LEVELS / (_LEVELS - levels)  # 1 / keep probability
    if _hashed_applies(x):
        return _HashedDropout.apply(x, levels, scale)
    # One float multiplier per element, 0 or `scale`, written straight into x's dtype.
    kept = torch.ge(_slices(x.shape, x.device), _threshold(p), out=torch.empty_like(x))
    return x * kept.mul_(scale)


def _slices(shape: torch.Size, device: torch.device | None) -> Tensor:
    """Uniform int16 values of `shape`, four cut from each 64-bit random draw."""
    count = shape.numel()
    bits = torch.empty((count + 3) // 4, dtype=torch.int64, device=device)
    bits.random_(-(1 << 63), None)  # the full 64-bit range: every bit uniform, no modulo
    return bits.view(torch.int16)[:count].view(shape)


def _threshold(p: float) -> int:
    """The int16 value below which a slice means "drop"."""
    return dropped_levels(p) - _LEVELS // 2


def _hashed_applies(x: Tensor) -> bool:
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and x.numel() >= HASHED_MIN
        and allowed()
        and _hashed_kernel() is not None
    )


class _HashedDropout(torch.autograd.Function):
    """x times 0 or `scale` by SplitMix64's words from one seed, made again in the backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, levels: int, scale: float) -> Tensor:
        seed = torch.empty((), dtype=torch.int64).random_(-(1 << 63), None)  # torch's generator
        ctx.save_for_backward(seed)
        ctx.levels, ctx.scale = levels, scale
        return _hashed(x, seed, levels, scale)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (seed,) = ctx.saved_tensors
        return _hashed(grad, seed, ctx.levels, ctx.scale), None, None


def _hashed(x: Tensor, seed: Tensor, levels: int, scale: float) -> Tensor:
    kernel = _hashed_kernel()
    assert kernel is not None  # `_hashed_applies` checked
    return kernel(x.reshape(-1), seed, levels, scale).view(x.shape)  # (N,) -> x's shape


@functools.cache
def _hashed_kernel() -> Callable[..., Any] | None:
    """`hashed_dropout` compiled, or None where it cannot be."""
    example = torch.zeros(HASHED_MIN)
    return compiled(hashed_dropout, example, torch.tensor(0), 6554, 1.0)


def hashed_dropout(x: Tensor, seed: Tensor, levels: int, scale: float) -> Tensor:
    """x (N,) times 0 where element i's 16-bit slice is below `levels`, else times `scale`:
    slice i mod 4 (low bits first) of SplitMix64's word i // 4 from `seed` (0-dim int64)."""
    index = torch.arange(x.numel(), device=x.device)  # (N,)
    word = _splitmix64(seed + (index >> 2) * _GAMMA)  # (N,) int64
    slices = (word >> (index & 3) * 16) & 0xFFFF  # (N,), 0 ... 65535
    return x * torch.where(slices >= levels, scale, 0.0)


def _splitmix64(z: Tensor) -> Tensor:
    """SplitMix64's mixing of an int64 state into its output word."""
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


def _shift_right(z: Tensor, bits: int) -> Tensor:
    """Logical (unsigned) right shift of int64 values by 1 ... 63 bits: `>>` keeps the sign."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


class Dropout(nn.Dropout):
    """`nn.Dropout` with cheaper masks; identity in eval mode."""

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        return dropout(x, self.p)
