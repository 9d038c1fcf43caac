"""Helpers shared by the decoding tests: the reference decoder, a fast copy of a model, the
`held` of a `select`, and what the searches found."""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from qkv import fast
from qkv.inference.beam import Hypothesis
from qkv.model.seq2seq import Seq2SeqTransformer


class ReferenceDecoder:
    """The search functions' decoder over the reference model alone: `encode`, `init_cache`,
    `decode_step` and the cache's `select`, what the fast decoders are tested against.

    Args:
        model: the translation model, in eval mode.
        src_ids: source ids (B, S).
        max_steps: the most tokens any row will be fed (BOS included).
        use_held: pass the searches' `held` on to the cache (False: every step of a moved row
            is copied).
    """

    def __init__(
        self, model: Seq2SeqTransformer, src_ids: Tensor, max_steps: int, use_held: bool = True
    ) -> None:
        self.model, self.use_held = model, use_held
        memory, src_mask, _ = model.encode(src_ids)  # (B, S, D), (B, 1, 1, S)
        self.cache = model.init_cache(memory, src_mask, max_steps)

    def step(self, tokens: Tensor) -> Tensor:
        """tokens (N,) -> next-token logits (N, V), in float32."""
        return self.model.decode_step(tokens, self.cache).float()  # (N, V)

    def select(self, rows: Tensor, held: Tensor | None = None) -> None:
        self.cache.select(rows, held if self.use_held else None)


def fast_copy(model: Seq2SeqTransformer) -> Seq2SeqTransformer:
    """A copy of `model` (the same weights) turned fast by `qkv.fast.apply`, as
    `Translator.load` turns the models it loads."""
    return fast.apply(copy.deepcopy(model))  # type: ignore[return-value]


def shared_prefixes(history: Tensor, sources: Tensor, rows: Tensor) -> Tensor:
    """The `held` of `select(rows)`: how many tokens fed (BOS first) place i holds that old
    row rows[i] holds too, for the same source; 0 for a place that held no row.

    Args:
        history: (N, t) the tokens fed to each row so far.
        sources: (N,) the source each row decodes.
        rows: (N',) new row i = old row rows[i].
    """
    held = []
    for place, row in enumerate(rows.tolist()):
        if place >= history.size(0) or sources[place] != sources[row]:
            held.append(0)
            continue
        same = (history[place] == history[row]).long()  # (t,)
        held.append(int(same.cumprod(0).sum()))
    return torch.tensor(held, dtype=torch.long)


def tokens_of(found: list[list[Hypothesis]]) -> list[list[list[int]]]:
    return [[h.tokens for h in hyps] for hyps in found]
