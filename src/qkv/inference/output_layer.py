"""The output layer frozen for decoding: its logits, and their argmax screened in bf16 or int8.

Greedy decoding needs only the index of each row's largest logit, l_v = h · w_v + b_v over
the V rows w_v of the output weight. On a CPU with native bf16 matmuls (AVX512-BF16, AMX) the
bf16 product of h and the weight runs about three times as fast as the float32 one. Rounding h,
the weight and the product to bf16 moves each logit by at most

    e(h) = c ‖h‖ max_v ‖w_v‖,   c = 3u + 4u² + 2dδ  (u = 2⁻⁸ for bf16, δ = 2⁻²⁴ for float32,
                                                      d terms to a dot product)

(rounding h and w_v: 2u + u² of Σ|h_i w_vi|, which Cauchy-Schwarz bounds by ‖h‖ ‖w_v‖; the
product's rounding to bf16: u; float32 sums: dδ in the bf16 product and dδ in the float32 one).
So no token whose screened logit is more than 2 e(h) below the row's best screened logit can
be the float32 argmax. The others, the candidates (one to a few per row), get their float32
logits computed one dot product each, and the largest wins: the first on ties, as `argmax`.

Where the layer has no bias, d <= 1040 and this CPU's int8 products are exact (checked once,
`int8_matmuls_exact`), the screen is an int8 product instead: twice as fast as the bf16 one on
a Zen 4 (0.36 against 0.74 ms at 64 x 256 x 8,000, with its float32 copy), and its logits need
no float32 copy. The weight is w_v = s ŵ_v + r_v with ŵ_v in int8 (one step s for the whole
weight), a row h = t ĥ + q with ĥ in int8 (its own step t = max_i |h_i| / 127). Then

    |l_v - t s ĥ·ŵ_v| = |h·r_v + q·(s ŵ_v)| <= ‖h‖ max_v ‖r_v‖ + ‖q‖ max_v ‖s ŵ_v‖,

with ‖q‖ computed in float32 for each row (off by at most 3δ ‖h‖), and ĥ·ŵ_v, at most
127² d < 2²⁴, exact in int32 and in float32. So rows are screened in those integers: no token
whose ĥ·ŵ_v is more than twice the bound (and the float32 sums' 2dδ ‖h‖ max_v ‖w_v‖), over
t s, below the row's largest can be the float32 argmax. The bound is wider than the bf16
screen's (583 candidates against 281 for 64 layer-normed rows at d = 256, V = 8,000), and the
screen a fifth faster all told; greedy decoding, 1.04–1.05× as fast
(`benchmarks/frozen_ab.py --change int8-screen`).

The result is the index `argmax` finds in the float32 logits, up to float32 rounding: a
near-tie closer than ~1e-6 may go the other way, as it may between two float32 matmul kernels.
A row whose screen finds no candidate (NaN or infinite states) falls back to the float32 logits,
and so does a call whose rows have more than 64 candidates each on average (equal logits).
The bf16 matmul reads subnormal numbers as 0, which the bound covers with a term of its own;
the int8 screen takes rows whose largest element is at least 2⁻⁹⁰ and leaves the others (and
weights as small) to the float32 logits.
"""

from __future__ import annotations

import copy
import functools
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from qkv.inference.search import _argmax
from qkv.model.frozen_linear import FrozenLinear, as_linear, cpu_bf16_matmuls

BLOCK = 64
"""Screened logits are searched in blocks of this many tokens: block maxima first, then only
inside the blocks that reach a row's threshold."""
MIN_VOCAB = 16 * BLOCK
"""Below this many tokens, the float32 logits are as fast."""
MIN_ROWS = 24
"""Below this many rows, the screen's few dozen small operations cost more than the faster
product saves (`benchmarks/screen_ab.py --calls`, 8,000 tokens, d_model 256, 2 threads: about
0.6× the float32 logits' speed at 1 to 4 rows, 1.0× at 16, 1.1–1.2× at 32, 1.4× at 64)."""
MAX_INT8_D = 1040
"""The widest rows the int8 screen takes: 127² d stays below 2²⁴, where float32 holds every
integer, so that its int32 products compare exactly with a float32 threshold."""
_U = 2.0**-8  # bf16 unit roundoff
_DELTA = 2.0**-24  # float32 unit roundoff
_SMALLEST_NORMAL = 2.0**-126  # of float32 and bf16
_INT8_SMALLEST = 2.0**-90  # the smallest largest element of a row (or weight) the int8 screen takes
_INT32_MIN = -(2**31)


@dataclass
class _Screen:
    """The bf16 copy of the output weight and the constants of the bound, made at the first
    screened `argmax` of an `OutputLayer` or of any of its `excluding` copies."""

    rounded: FrozenLinear
    scale: float
    offset: float


@dataclass
class _QuantizedScreen:
    """The int8 copy of the output weight and the constants of its bound, in steps t s of a
    row's integer products: the margin of a row h = t ĥ + q is (`per_norm` ‖h‖ + `per_rest`
    ‖q‖) / t."""

    weight: Tensor  # (V', D) int8, the rows beyond V zero
    per_norm: float
    per_rest: float


class OutputLayer:
    """The output layer frozen for decoding: `logits(x)`, and `argmax(x)` screened in bf16
    for float32 rows x (N, D) on the CPU.

    The weight is reordered at the first call, and copied and rounded to bf16 or int8 at the
    first `argmax` (a bf16 copy held reordered only, where it can be): make a new one after it
    changes.

    Args:
        linear: the output layer, (V, D) weight and an optional bias.
        rows: the usual number of rows per call (a hint for the float32 and bf16 layouts).
        never: token ids never chosen (their logits are -inf), e.g. EOS for outputs of a
            fixed length.
        screen: True screens float32 rows on the CPU, any number of them (tests); False
            never; None where it pays: on a CPU with native bf16 matmuls, V >= MIN_VOCAB,
            calls of MIN_ROWS rows or more.
        quantize: how a screen is made: True in int8 where the layer allows it (no bias,
            D <= MAX_INT8_D) and this CPU's int8 products are exact, else in bf16 (tests);
            False in bf16; None in int8 where it applies.

    Raises:
        ValueError: if a `never` id is not in [0, V).
    """

    def __init__(
        self,
        linear: nn.Linear,
        rows: int,
        never: Sequence[int] = (),
        screen: bool | None = None,
        quantize: bool | None = None,
    ) -> None:
        self.exact = FrozenLinear(linear, rows)
        weight = linear.weight.detach()  # (V, D)
        self.vocab_size, self.d = weight.shape
        self.never = _token_ids(never, self.vocab_size, weight.device)  # (k,)
        self.bias = None if linear.bias is None else linear.bias.detach()  # (V,)
        self.min_rows = 1 if screen else MIN_ROWS
        on_cpu = weight.device.type == "cpu"
        if screen is None:
            screen = on_cpu and self.vocab_size >= MIN_VOCAB and cpu_bf16_matmuls()
        self.screens = bool(screen) and on_cpu and _is_float32(weight)
        # Asked of the CPU only for a screen that could be made in int8.
        self.quantizes = (
            self.screens
            and quantize is not False
            and self.bias is None
            and self.d <= MAX_INT8_D
            and int8_matmuls_exact()
        )
        self.rows = rows
        # Made at the first `argmax`, by one thread at a time; shared by the copies.
        self._screen: list[_Screen | _QuantizedScreen] = []
        self._making = threading.Lock()
        self.candidates = 0  # tokens the last screened `argmax` settled in float32, all rows

    def excluding(self, never: Sequence[int]) -> OutputLayer:
        """This layer with other `never` tokens, sharing its frozen weights (no copy).

        Raises:
            ValueError: if a `never` id is not in [0, V).
        """
        twin = copy.copy(self)
        twin.never = _token_ids(never, self.vocab_size, self.never.device)  # (k,)
        return twin

    @property
    def rounded(self) -> FrozenLinear | None:
        """The bf16 copy of the weight (V', D), once a screened `argmax` has made it."""
        screen = self._screen[0] if self._screen else None
        return screen.rounded if isinstance(screen, _Screen) else None

    @property
    def quantized(self) -> Tensor | None:
        """The int8 copy of the weight (V', D), once a screened `argmax` has made it."""
        screen = self._screen[0] if self._screen else None
        return screen.weight if isinstance(screen, _QuantizedScreen) else None

    def _prepare_screen(self) -> _Screen | _QuantizedScreen:
        with self._making:
            if not self._screen:
                weight = self.exact.linear.weight.detach()  # (V, D) float32
                made = self._quantized_screen(weight) if self.quantizes else None
                self._screen.append(made or self._rounded_screen(weight))
        return self._screen[0]

    def _rounded_screen(self, weight: Tensor) -> _Screen:
        """The bf16 screen of the weight (V, D)."""
        blocks = -(-self.vocab_size // BLOCK)
        rounded = weight.new_zeros(blocks * BLOCK, self.d, dtype=torch.bfloat16)  # (V', D)
        rounded[: self.vocab_size] = weight
        c = 3 * _U + 4 * _U * _U + 2 * self.d * _DELTA
        w_max = float(_norms(weight).max())
        b_max = 0.0 if self.bias is None else float(self.bias.abs().max())
        # The bf16 matmul reads subnormal inputs as 0: each side's flushed part moves a logit
        # by at most 2⁻¹²⁶ √d times the other side's norm.
        flushed = _SMALLEST_NORMAL * self.d**0.5
        # Twice e(h), as 2 (scale ‖h‖ + offset): with the float32 rounding of adding the bias
        # and of the threshold's own arithmetic (4δ of |logit| <= 1.1 ‖h‖ w_max + b_max), and
        # 1 % to spare.
        scale = 2.02 * ((c + 5 * _DELTA) * w_max + flushed)
        offset = 2.02 * (5 * _DELTA * b_max + flushed * w_max) + 1e-30
        # The bf16 copy is the screen's own: once reordered, its plain layout is let go.
        return _Screen(FrozenLinear(as_linear(rounded), self.rows).reordered_only(), scale, offset)

    def _quantized_screen(self, weight: Tensor) -> _QuantizedScreen | None:
        """The int8 screen of the weight (V, D), or None for a weight too small for it."""
        largest = float(weight.abs().max())
        if not math.isfinite(largest) or largest < _INT8_SMALLEST:
            return None
        step = largest / 127  # s
        blocks = -(-self.vocab_size // BLOCK)
        quantized = weight.new_zeros(blocks * BLOCK, self.d, dtype=torch.int8)  # (V', D) ŵ
        residual = kept = 0.0  # max ‖r_v‖, max ‖s ŵ_v‖
        for start in range(0, self.vocab_size, NORM_CHUNK):  # no float64 copy of it all
            rows = weight[start : start + NORM_CHUNK]  # (c, D)
            steps = (rows / step).round_().clamp_(-127, 127)  # (c, D) integers in float32
            quantized[start : start + len(rows)] = steps.to(torch.int8)
            exact = steps.double() * step  # (c, D) s ŵ_v, exact in float64
            residual = max(residual, float(torch.linalg.vector_norm(rows - exact, dim=1).max()))
            kept = max(kept, float(torch.linalg.vector_norm(exact, dim=1).max()))
        w_max = float(_norms(weight).max())
        # Twice the bound, over s (a row's t divides at each call): ‖h‖ (max ‖r_v‖, the float32
        # sums' 2dδ w_max, and 3δ max ‖s ŵ_v‖ for the rounding of ‖q‖) and ‖q‖ max ‖s ŵ_v‖.
        # The 1 % to spare covers rounded norms and margins. The threshold's subtraction rounds
        # to nearest, never past an integer below 2²⁴ (each exact in float32): no product
        # within the margin is lost.
        per_norm = 2.02 * (residual + 2 * self.d * _DELTA * w_max + 3 * _DELTA * kept)
        per_norm *= (1 + 1e-6) / step
        per_rest = 2.02 * kept * (1 + 1e-6) / step
        return _QuantizedScreen(quantized, per_norm, per_rest)

    def argmax(self, x: Tensor) -> Tensor:
        """x (N, D) -> the index of each row's largest logit (N,) long."""
        if (
            not (self.screens and x.device.type == "cpu" and _is_float32(x))
            or len(x) < self.min_rows
        ):
            return _argmax(self.logits(x).float())  # (N,)
        found = self._screened(x)  # (N,)
        if bool((found == self.vocab_size).any()):  # no candidate (NaN, inf), or too many
            return _argmax(self.logits(x).float())  # (N,)
        return found

    def logits(self, x: Tensor) -> Tensor:
        """x (..., D) -> logits (..., V) in the layer's dtype, the `never` tokens at -inf."""
        logits = self.exact(x)  # (..., V)
        if self.never.numel() > 0:  # in place, unless autograd tracks the logits
            fill = logits.index_fill if logits.requires_grad else logits.index_fill_
            logits = fill(-1, self.never, float("-inf"))
        return logits

    def _screened(self, x: Tensor) -> Tensor:
        """x (N, D) float32 -> argmax (N,) long; V for a row with no candidate."""
        n, vocab_size = x.size(0), self.vocab_size
        screen = self._prepare_screen()
        with torch.no_grad():  # an argmax has no gradient; the bf16 copy may be reordered only
            if isinstance(screen, _QuantizedScreen):
                screened, margin = _int8_products(x, screen)  # (N, V') int32, (N,)
                lowest: float = _INT32_MIN
            else:
                screened, margin = _bf16_logits(x, screen, self.bias)  # (N, V') float32, (N,)
                lowest = float("-inf")
        if screened.size(1) > vocab_size:
            screened[:, vocab_size:] = lowest
        if self.never.numel() > 0:
            screened.index_fill_(1, self.never, lowest)
        blocks = screened.size(1) // BLOCK
        block_max = screened.view(n, blocks, BLOCK).amax(dim=-1)  # (N, V' / 64)
        threshold = block_max.amax(dim=-1) - margin  # (N,) float32
        threshold = threshold.where(threshold.isfinite(), torch.nan)  # no candidate: fall back

        rows, block = (block_max >= threshold[:, None]).nonzero().unbind(1)  # (P,) each
        inside = screened.view(n * blocks, BLOCK).index_select(0, rows * blocks + block)
        pair, column = (inside >= threshold[rows, None]).nonzero().unbind(1)  # (C,) each
        rows, tokens = rows[pair], block[pair] * BLOCK + column  # (C,) candidates
        self.candidates = tokens.numel()
        if self.candidates > n * BLOCK:  # degenerate rows (equal logits): the float32 logits
            return torch.full((n,), vocab_size, dtype=torch.long, device=x.device)  # (N,)
        weight = self.exact.linear.weight.detach()  # (V, D)
        exact = (x.index_select(0, rows) * weight.index_select(0, tokens)).sum(dim=-1)  # (C,)
        if self.bias is not None:
            exact += self.bias[tokens]

        best = x.new_full((n,), float("-inf")).scatter_reduce(0, rows, exact, "amax")  # (N,)
        winners = tokens.where(exact == best[rows], vocab_size)  # (C,) V for the others
        found = torch.full((n,), vocab_size, dtype=torch.long, device=x.device)  # (N,)
        return found.scatter_reduce(0, rows, winners, "amin")  # (N,) first on ties


def _bf16_logits(x: Tensor, screen: _Screen, bias: Tensor | None) -> tuple[Tensor, Tensor]:
    """x (N, D) float32 -> the screened logits (N, V') float32, and each row's margin (N,):
    twice the bound on their distance from the float32 logits."""
    screened = screen.rounded(x.to(torch.bfloat16)).float()  # (N, V')
    if bias is not None:
        screened[:, : bias.numel()] += bias
    return screened, screen.scale * _norms(x) + screen.offset


def _int8_products(x: Tensor, screen: _QuantizedScreen) -> tuple[Tensor, Tensor]:
    """x (N, D) float32 -> the integer products ĥ·ŵ_v (N, V') int32, and each row's margin
    (N,) in steps of them; NaN for rows whose largest element is below 2⁻⁹⁰ or not finite."""
    largest = x.abs().amax(dim=1)  # (N,)
    step = largest / 127  # (N,) t
    steps = (x / step[:, None]).round_()  # (N, D) ĥ, integers in float32
    products = torch._int_mm(steps.to(torch.int8), screen.weight.t())  # (N, V')
    rest = _norms(steps.mul_(step[:, None]).sub_(x))  # (N,) ‖q‖ = ‖h - t ĥ‖ (float32 rounding)
    margin = (screen.per_norm * _norms(x) + screen.per_rest * rest) / step  # (N,)
    usable = (largest >= _INT8_SMALLEST) & largest.isfinite()  # (N,)
    return products, margin.where(usable, torch.nan)


@functools.cache
def int8_matmuls_exact() -> bool:
    """Whether this CPU's int8 products (`torch._int_mm`) sum exactly in int32, checked once on
    the operands that overflow 16-bit partial sums (which some kernels saturate) and on random
    ones. Where it is not, or the operator is missing, the screen is made in bf16."""
    if not hasattr(torch, "_int_mm"):
        return False
    generator = torch.Generator().manual_seed(0)
    random = torch.randint(-127, 128, (32, 512), dtype=torch.int8, generator=generator)
    extreme = torch.full((32, 512), 127, dtype=torch.int8)
    extreme[1::2] = -127
    operands = [(extreme, extreme.t()), (extreme, random.t()), (random, random.t())]
    try:
        with torch.no_grad():
            return all(
                torch.equal(torch._int_mm(a, b).long(), a.long() @ b.long()) for a, b in operands
            )
    except RuntimeError:
        return False


def _token_ids(never: Sequence[int], vocab_size: int, device: torch.device) -> Tensor:
    if any(not 0 <= int(token) < vocab_size for token in never):
        raise ValueError(f"never: token ids must be in [0, {vocab_size}), got {never}")
    return torch.tensor(list(never), dtype=torch.long, device=device)  # (k,)


NORM_CHUNK = 1024
"""Rows whose norms are taken at once: the float64 copy of a vocabulary's weight (V, D) would
add 16 MB to decoding's peak memory at V = 8,000."""


def _norms(rows: Tensor) -> Tensor:
    """Euclidean norms of the rows (N, D) -> (N,) float32, summed in float64: squares below
    float32's smallest normal number would read as 0. `NORM_CHUNK` rows at a time."""
    if len(rows) <= NORM_CHUNK:
        return torch.linalg.vector_norm(rows, dim=1, dtype=torch.float64).float()
    return torch.cat([_norms(chunk) for chunk in rows.split(NORM_CHUNK)])  # (N,)


def _is_float32(t: Tensor) -> bool:
    return t.dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
