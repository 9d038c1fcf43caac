"""Greedy search's argmax over the output layer, screened in int8 on a CPU.

Greedy decoding needs only the index of each row's largest logit l_v = h·w_v, over the V rows
w_v of the output weight (no bias). That product is some 40 % of a small model's decoding step,
and an int8 product takes half its time. The screen keeps every token that can be the float32
argmax, and computes only those few logits in float32.

The weight is w_v = s ŵ_v + r_v with ŵ_v in int8 (one step s for the whole weight); a row is
h = t ĥ + q with ĥ in int8 (its own step t = max_i |h_i| / 127). Then

    l_v - t s ĥ·ŵ_v = h·r_v + s q·ŵ_v,   so   |l_v - t s ĥ·ŵ_v| <= ‖h‖ R + ‖q‖ W = e(h),

with R = max_v ‖r_v‖ and W = max_v ‖s ŵ_v‖ (Cauchy-Schwarz). No token whose integer product
ĥ·ŵ_v lies more than 2 e(h) / (t s) below the row's largest can be the argmax. The margin also
covers the float32 sums of the logits (2 d δ ‖h‖ max_v ‖w_v‖, δ = 2⁻²⁴) and the rounding of
‖q‖ (3 δ ‖h‖ W), with 1 % to spare. For d <= 1040, |ĥ·ŵ_v| <= 127² d < 2²⁴: exact in int32 and
in float32, so the threshold compares exactly.

The result is the float32 logits' `argmax` (the first on ties) up to their own rounding: a
near-tie within ~1e-6 may go the other way, as between two float32 kernels. `argmax` gives None,
and the caller takes the float32 logits, for rows that are not finite or nearly zero, and where
the rows have too many candidates (equal logits).

`torch._int_mm` is private: a screen is made only where `int8_matmuls_exact` finds it present
and exact on this CPU (some kernels saturate 16-bit partial sums).
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

BLOCK = 64  # products searched in blocks: block maxima first, then inside the blocks that pass
MIN_VOCAB = 16 * BLOCK  # smaller vocabularies: the float32 logits are as fast
MIN_ROWS = 16  # fewer rows a call: the screen's small operations cost more than it saves
MAX_D = 1040  # wider rows: 127² d would pass 2²⁴, where float32 stops holding every integer
_DELTA = 2.0**-24  # float32 unit roundoff
_SMALLEST = 2.0**-90  # rows (and weights) whose largest element is below it: float32 logits
_LOWEST = -(2**31)


class Int8Screen:
    """The int8 copy of an output weight (V, D) float32, and the constants of its bound: made
    by `of`, for a weight whose largest element is finite and at least 2⁻⁹⁰."""

    def __init__(self, weight: Tensor, largest: float) -> None:
        self.weight = weight  # (V, D)
        self.vocab_size, d = weight.shape
        step = largest / 127  # s
        blocks = -(-self.vocab_size // BLOCK)
        self.quantized = weight.new_zeros(blocks * BLOCK, d, dtype=torch.int8)  # (V', D) ŵ
        residual = kept = widest = 0.0  # max ‖r_v‖, max ‖s ŵ_v‖, max ‖w_v‖
        for start in range(0, self.vocab_size, 1024):  # no float64 copy of the whole weight
            rows = weight[start : start + 1024].double()  # (c, D)
            steps = (rows / step).round_().clamp_(-127, 127)  # (c, D) ŵ_v
            self.quantized[start : start + len(rows)] = steps.to(torch.int8)
            residual = max(residual, float(_norms(rows - steps * step).max()))
            kept = max(kept, float(_norms(steps * step).max()))
            widest = max(widest, float(_norms(rows).max()))
        spare = 2.02 * (1 + 1e-6) / step  # twice the bound, in steps of t s (t at each call)
        self.per_norm = spare * (residual + 2 * d * _DELTA * widest + 3 * _DELTA * kept)
        self.per_rest = spare * kept

    @classmethod
    def applies(cls, weight: Tensor) -> bool:
        """Whether a screen can be made of a weight of this shape, dtype and device here (its
        values are looked at by `of`)."""
        return (
            weight.device.type == "cpu"
            and weight.dtype == torch.float32
            and weight.size(0) >= MIN_VOCAB
            and weight.size(1) <= MAX_D
            and int8_matmuls_exact()
        )

    @classmethod
    def of(cls, weight: Tensor) -> Int8Screen | None:
        """The screen of `weight` (V, D), where `applies`; None for a weight whose largest
        element is not finite or below 2⁻⁹⁰ (its logits are left to float32)."""
        largest = float(weight.abs().max())
        return cls(weight, largest) if math.isfinite(largest) and largest >= _SMALLEST else None

    def argmax(self, x: Tensor, never: Tensor) -> Tensor | None:
        """x (N, D) float32 -> the index of each row's largest logit (N,) long, the `never`
        tokens (k,) excluded; None where the float32 logits must decide."""
        largest = x.abs().amax(dim=1)  # (N,)
        if not bool(((largest >= _SMALLEST) & largest.isfinite()).all()):
            return None
        n, step = x.size(0), largest / 127  # (N,) t
        steps = (x / step[:, None]).round_()  # (N, D) ĥ, integers in float32
        products = _int8_products(steps.to(torch.int8), self.quantized.t())  # (N, V') int32
        rest = _norms(steps.mul_(step[:, None]).sub_(x))  # (N,) ‖q‖
        margin = (self.per_norm * _norms(x) + self.per_rest * rest) / step  # (N,)
        products[:, self.vocab_size :] = _LOWEST
        if never.numel() > 0:
            products.index_fill_(1, never, _LOWEST)

        blocks = products.size(1) // BLOCK
        block_max = products.view(n, blocks, BLOCK).amax(dim=-1)  # (N, V' / 64)
        threshold = block_max.amax(dim=-1) - margin  # (N,) float32
        rows, block = (block_max >= threshold[:, None]).nonzero().unbind(1)  # (P,) each
        inside = products.view(n * blocks, BLOCK).index_select(0, rows * blocks + block)
        pair, column = (inside >= threshold[rows, None]).nonzero().unbind(1)  # (C,) each
        rows, tokens = rows[pair], block[pair] * BLOCK + column  # (C,) the candidates
        if tokens.numel() > n * BLOCK:
            return None
        exact = (x.index_select(0, rows) * self.weight.index_select(0, tokens)).sum(-1)  # (C,)
        best = x.new_full((n,), -math.inf).scatter_reduce(0, rows, exact, "amax")  # (N,)
        winners = tokens.where(exact == best[rows], self.vocab_size)  # (C,) V: not the best
        found = torch.full((n,), self.vocab_size, dtype=torch.long, device=x.device)
        found = found.scatter_reduce(0, rows, winners, "amin")  # (N,) the first on ties
        return None if bool((found == self.vocab_size).any()) else found


@functools.cache
def int8_matmuls_exact() -> bool:
    """Whether `torch._int_mm` is present and sums exactly in int32 on this CPU: checked once,
    on operands that overflow 16-bit partial sums and on random ones."""
    if not hasattr(torch, "_int_mm"):
        return False
    generator = torch.Generator().manual_seed(0)
    random = torch.randint(-127, 128, (32, 512), dtype=torch.int8, generator=generator)
    extreme = torch.full((32, 512), 127, dtype=torch.int8)
    extreme[1::2] = -127
    pairs = [(extreme, extreme.t()), (extreme, random.t()), (random, random.t())]
    try:
        with torch.no_grad():
            return all(
                torch.equal(_int8_products(a, b).long(), a.long() @ b.long()) for a, b in pairs
            )
    except RuntimeError:
        return False


def _int8_products(a: Tensor, b: Tensor) -> Tensor:
    """a (N, D) int8 @ b (D, V) int8 -> (N, V) int32: the one call of the private
    `torch._int_mm`, made only once `int8_matmuls_exact` has found it present and exact."""
    products: Tensor = torch._int_mm(a, b)
    return products


def _norms(rows: Tensor) -> Tensor:
    """Euclidean norms of rows (N, D) -> (N,) float32, summed in float64 (float32 squares of
    tiny elements would read as 0)."""
    return torch.linalg.vector_norm(rows, dim=1, dtype=torch.float64).float()
