"""The output layer frozen for decoding: logits, with tokens a search must never pick."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from qkv.fast.frozen_linear import FrozenLinear
from qkv.inference.search import first_argmax


class OutputLayer:
    """`logits(x)` and `argmax(x)` of a frozen copy of `linear`; make a new one after the
    weight changes. `never` token ids (in [0, V), else ValueError) get -inf logits."""

    def __init__(self, linear: nn.Linear, never: Sequence[int] = ()) -> None:
        self.exact = FrozenLinear(linear, min_rows=1)  # wide: oneDNN's is faster at any rows
        self.vocab_size = linear.weight.size(0)
        self.never = _token_ids(never, self.vocab_size, linear.weight.device)  # (k,)

    def excluding(self, never: Sequence[int]) -> OutputLayer:
        """This layer with other `never` tokens, sharing its frozen weights."""
        twin = copy.copy(self)
        twin.never = _token_ids(never, self.vocab_size, self.never.device)  # (k,)
        return twin

    def argmax(self, x: Tensor) -> Tensor:
        """x (N, D) -> the index of each row's largest logit (N,) long, the first on ties."""
        return first_argmax(self.logits(x).float())  # (N,)

    def logits(self, x: Tensor) -> Tensor:
        """x (..., D) -> logits (..., V) in the layer's dtype, the `never` tokens at -inf."""
        logits = self.exact(x)  # (..., V)
        if self.never.numel() > 0:  # in place, unless autograd tracks the logits
            fill = logits.index_fill if logits.requires_grad else logits.index_fill_
            logits = fill(-1, self.never, float("-inf"))
        return logits


def _token_ids(never: Sequence[int], vocab_size: int, device: torch.device) -> Tensor:
    if any(not 0 <= int(token) < vocab_size for token in never):
        raise ValueError(f"never: token ids must be in [0, {vocab_size}), got {never}")
    return torch.tensor(list(never), dtype=torch.long, device=device)  # (k,)
