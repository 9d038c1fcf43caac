"""The output layer frozen for decoding: its logits, and their argmax screened in bf16.

Greedy decoding needs only each row's largest logit l_v = h · w_v + b_v. On a CPU with native
bf16 matmuls the bf16 product is much faster than the float32 one, and rounding h, the weight
and the product to bf16 moves each logit by at most

    e(h) = c ‖h‖ max_v ‖w_v‖,   c = 3u + 4u² + 2dδ  (u = 2⁻⁸, δ = 2⁻²⁴, d terms to a product)

(rounding h and w_v: 2u + u² of Σ|h_i w_vi| ≤ ‖h‖ ‖w_v‖; the product: u; float32 sums: dδ).
Only the tokens within 2 e(h) of the row's best screened logit (the candidates) get float32
logits; the largest wins, the first on ties. Rows with no candidate (NaN or infinite states),
and calls averaging over 64 candidates a row, fall back to the float32 logits.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from qkv.fast.frozen_linear import FrozenLinear, as_linear, cpu_bf16_matmuls
from qkv.inference.search import first_argmax

BLOCK = 64  # screened logits are searched by blocks of this many tokens
MIN_VOCAB = 16 * BLOCK  # below this many tokens, the float32 logits are as fast
MIN_ROWS = 24  # below this many rows, the screen's small operations cost more than it saves
_U = 2.0**-8  # bf16 unit roundoff
_DELTA = 2.0**-24  # float32 unit roundoff
_SMALLEST_NORMAL = 2.0**-126  # of float32 and bf16


@dataclass
class _Screen:
    """The bf16 copy of the output weight and the constants of the bound."""

    rounded: FrozenLinear
    scale: float
    offset: float


class OutputLayer:
    """`logits(x)`, and `argmax(x)` screened in bf16 for float32 rows x (N, D) on the CPU;
    make a new one after the weight changes. `never` token ids (in [0, V), else ValueError)
    get -inf logits. `screen`: True screens any float32 CPU rows (tests), False never, None
    where it pays (native bf16 matmuls, V >= MIN_VOCAB, MIN_ROWS rows or more)."""

    def __init__(
        self,
        linear: nn.Linear,
        rows: int,
        never: Sequence[int] = (),
        screen: bool | None = None,
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
        self.rows = rows
        # Made at the first `argmax`, by one thread at a time; shared by the copies.
        self._screen: list[_Screen] = []
        self._making = threading.Lock()
        self.candidates = 0  # tokens the last screened `argmax` settled in float32, all rows

    def excluding(self, never: Sequence[int]) -> OutputLayer:
        """This layer with other `never` tokens, sharing its frozen weights."""
        twin = copy.copy(self)
        twin.never = _token_ids(never, self.vocab_size, self.never.device)  # (k,)
        return twin

    @property
    def rounded(self) -> FrozenLinear | None:
        """The bf16 copy of the weight (V', D), once a screened `argmax` has made it."""
        return self._screen[0].rounded if self._screen else None

    def _prepare_screen(self) -> _Screen:
        """The screen, made at the first screened `argmax` of this layer or its copies."""
        with self._making:
            if self._screen:
                return self._screen[0]
            weight = self.exact.linear.weight.detach()  # (V, D) float32
            blocks = -(-self.vocab_size // BLOCK)
            rounded = weight.new_zeros(blocks * BLOCK, self.d, dtype=torch.bfloat16)  # (V', D)
            rounded[: self.vocab_size] = weight
            c = 3 * _U + 4 * _U * _U + 2 * self.d * _DELTA
            w_max = float(_norms(weight).max())
            b_max = 0.0 if self.bias is None else float(self.bias.abs().max())
            # The bf16 matmul reads subnormal inputs as 0: each side's flushed part moves a
            # logit by at most 2⁻¹²⁶ √d times the other side's norm.
            flushed = _SMALLEST_NORMAL * self.d**0.5
            # Twice e(h), as 2 (scale ‖h‖ + offset), with the float32 rounding of adding the
            # bias and of the threshold's own arithmetic, and 1 % to spare.
            scale = 2.02 * ((c + 5 * _DELTA) * w_max + flushed)
            offset = 2.02 * (5 * _DELTA * b_max + flushed * w_max) + 1e-30
            frozen = FrozenLinear(as_linear(rounded), self.rows).reordered_only()
            self._screen.append(_Screen(frozen, scale, offset))
            return self._screen[0]

    def argmax(self, x: Tensor) -> Tensor:
        """x (N, D) -> the index of each row's largest logit (N,) long."""
        if self.screens and x.device.type == "cpu" and _is_float32(x) and len(x) >= self.min_rows:
            found = self._screened(x)  # (N,)
            if not bool((found == self.vocab_size).any()):  # else: no candidate, or too many
                return found
        return first_argmax(self.logits(x).float())  # (N,)

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
        with torch.no_grad():  # the bf16 copy may be reordered only
            screened = screen.rounded(x.to(torch.bfloat16)).float()  # (N, V')
            margin = screen.scale * _norms(x) + screen.offset  # (N,) twice the bound
        if self.bias is not None:
            screened[:, :vocab_size] += self.bias
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


def _token_ids(never: Sequence[int], vocab_size: int, device: torch.device) -> Tensor:
    if any(not 0 <= int(token) < vocab_size for token in never):
        raise ValueError(f"never: token ids must be in [0, {vocab_size}), got {never}")
    return torch.tensor(list(never), dtype=torch.long, device=device)  # (k,)


NORM_CHUNK = 1024  # rows whose norms are taken at once: a float64 copy of a few rows only


def _norms(rows: Tensor) -> Tensor:
    """Norms of the rows (N, D) -> (N,) float32, summed in float64 (tiny squares count)."""
    if len(rows) <= NORM_CHUNK:
        return torch.linalg.vector_norm(rows, dim=1, dtype=torch.float64).float()
    return torch.cat([_norms(chunk) for chunk in rows.split(NORM_CHUNK)])  # (N,)


def _is_float32(t: Tensor) -> bool:
    return t.dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
