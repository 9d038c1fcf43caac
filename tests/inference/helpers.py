"""Helpers shared by the tests of the fixed-shape searches (CPU and GPU)."""

from __future__ import annotations

import torch

from qkv.data.special import EOS_ID
from qkv.inference.beam import Hypothesis
from qkv.inference.graphed import StaticDecoder
from qkv.model.seq2seq import Seq2SeqTransformer


class EndingOften(StaticDecoder):
    """A fixed-shape decoder whose logits favour EOS by `eos_bias`, so that hypotheses end at
    many different steps."""

    eos_bias = 0.0

    def compute(self) -> torch.Tensor:
        logits = super().compute()  # (R, V)
        logits[:, EOS_ID] += self.eos_bias
        return logits


def decoder(
    model: Seq2SeqTransformer, src: torch.Tensor, steps: int, rows: int, eos_bias: float = 0.0
) -> EndingOften:
    made = EndingOften(model, src, steps, rows, graph=False)
    made.eos_bias = eos_bias
    return made


def tokens_of(found: list[list[Hypothesis]]) -> list[list[list[int]]]:
    return [[h.tokens for h in hyps] for hyps in found]
