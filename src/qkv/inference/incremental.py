"""Adapter from a `Seq2SeqTransformer` and its KV cache to the search functions' decoder."""

from __future__ import annotations

from torch import Tensor

from qkv.model.frozen_linear import FrozenLinear
from qkv.model.seq2seq import Seq2SeqTransformer


class ModelDecoder:
    """Encodes a batch of sources once, then decodes step by step on a preallocated cache.

    The output projection is frozen for the batch (`FrozenLinear`): decoding does not change
    the weights.

    Args:
        model: the translation model, in eval mode.
        src_ids: source ids (B, S).
        max_steps: the most tokens any row will be fed (BOS included).
    """

    def __init__(self, model: Seq2SeqTransformer, src_ids: Tensor, max_steps: int) -> None:
        self.model = model
        memory, src_mask, _ = model.encode(src_ids)  # (B, S, D), (B, 1, 1, S)
        self.cache = model.init_cache(memory, src_mask, max_steps)
        self.output = FrozenLinear(model.output, src_ids.size(0))

    def step(self, tokens: Tensor) -> Tensor:
        """tokens (N,) -> next-token logits (N, V), in float32."""
        return self.model.decode_step(tokens, self.cache, self.output).float()  # (N, V)

    def select(self, rows: Tensor) -> None:
        """Keep and reorder rows: new row i = old row rows[i]."""
        self.cache.select(rows)
