"""The output layer frozen for decoding: logits, with tokens a search must never pick, and
greedy search's argmax, screened in int8 where it pays (`qkv.fast.screen`)."""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from qkv.fast.frozen_linear import FrozenLinear
from qkv.fast.screen import MIN_ROWS, Int8Screen
from qkv.inference.search import first_argmax


class OutputLayer:
    """`logits(x)` and `argmax(x)` of a frozen copy of `linear`; make a new one after the
    weight changes. `never` token ids (in [0, V), else ValueError) get -inf logits. With
    `fast`, the layer is a `FrozenLinear`, and `argmax` of MIN_ROWS float32 rows or more is
    screened in int8 where this CPU allows it (the screen made at the first such call, shared by
    `excluding` copies); without, the logits are `linear`'s own."""

    def __init__(self, linear: nn.Linear, never: Sequence[int] = (), fast: bool = True) -> None:
        # wide: oneDNN's product is faster at any number of rows
        self.exact: nn.Module = FrozenLinear(linear, min_rows=1) if fast else linear
        self.weight = linear.weight
        self.vocab_size = linear.weight.size(0)
        self.never = _token_ids(never, self.vocab_size, linear.weight.device)  # (k,)
        self.screens = fast and linear.bias is None and Int8Screen.applies(linear.weight)
        self._screen: list[Int8Screen | None] = []  # made once, by one thread
        self._making = threading.Lock()

    def excluding(self, never: Sequence[int]) -> OutputLayer:
        """This layer with other `never` tokens, sharing its frozen weights."""
        twin = copy.copy(self)
        twin.never = _token_ids(never, self.vocab_size, self.never.device)  # (k,)
        return twin

    def argmax(self, x: Tensor) -> Tensor:
        """x (N, D) -> the index of each row's largest logit (N,) long, the first on ties."""
        if self.screens and len(x) >= MIN_ROWS and x.is_cpu and x.dtype == torch.float32:
            screen = self._int8_screen()
            with torch.no_grad():
                found = None if screen is None else screen.argmax(x, self.never)  # (N,)
            if found is not None:
                return found
        return first_argmax(self.logits(x).float())  # (N,)

    def logits(self, x: Tensor) -> Tensor:
        """x (..., D) -> logits (..., V) in the layer's dtype, the `never` tokens at -inf."""
        logits = self.exact(x)  # (..., V)
        if self.never.numel() > 0:  # in place, unless autograd tracks the logits
            fill = logits.index_fill if logits.requires_grad else logits.index_fill_
            logits = fill(-1, self.never, float("-inf"))
        return logits

    def _int8_screen(self) -> Int8Screen | None:
        with self._making:
            if not self._screen:
                self._screen.append(Int8Screen.of(self.weight.detach()))
            return self._screen[0]


def _token_ids(never: Sequence[int], vocab_size: int, device: torch.device) -> Tensor:
    if any(not 0 <= int(token) < vocab_size for token in never):
        raise ValueError(f"never: token ids must be in [0, {vocab_size}), got {never}")
    return torch.tensor(list(never), dtype=torch.long, device=device)  # (k,)
