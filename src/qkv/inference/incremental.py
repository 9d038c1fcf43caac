"""Adapter from a `Seq2SeqTransformer` and its KV cache to the search functions' decoder."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from qkv.inference.output_layer import OutputLayer
from qkv.model.frozen_linear import frozen_copy
from qkv.model.seq2seq import Seq2SeqTransformer


class ModelDecoder:
    """Encodes a batch of sources once, then decodes step by step on a preallocated cache.

    The decoder's linear layers and the output layer are frozen for the batch (`frozen_copy`,
    `OutputLayer`): decoding does not change the weights. Greedy search asks for `step_argmax`,
    whose argmax is screened in bf16 where the CPU multiplies bf16 natively, and settled in
    float32.

    Args:
        model: the translation model, in eval mode.
        src_ids: source ids (B, S).
        max_steps: the most tokens any row will be fed (BOS included).
        never: token ids never chosen (their logits are -inf), e.g. EOS for outputs of a
            fixed length.
    """

    def __init__(
        self,
        model: Seq2SeqTransformer,
        src_ids: Tensor,
        max_steps: int,
        never: Sequence[int] = (),
    ) -> None:
        self.model = model
        memory, src_mask, _ = model.encode(src_ids)  # (B, S, D), (B, 1, 1, S)
        self.cache = model.init_cache(memory, src_mask, max_steps)
        self.decoder = frozen_copy(model.decoder, src_ids.size(0))
        self.output = OutputLayer(model.output, src_ids.size(0), never)

    def step(self, tokens: Tensor) -> Tensor:
        """tokens (N,) -> next-token logits (N, V), in float32."""
        return self.output.logits(self._states(tokens)).float()  # (N, V)

    def step_argmax(self, tokens: Tensor) -> Tensor:
        """tokens (N,) -> the index of each row's largest next-token logit (N,) long."""
        return self.output.argmax(self._states(tokens))  # (N,)

    def _states(self, tokens: Tensor) -> Tensor:
        """tokens (N,) -> the decoder's states (N, D); the cache grows by one position."""
        return self.decoder.step(tokens[:, None], self.cache)[:, 0]  # (N, D)

    def select(self, rows: Tensor) -> None:
        """Keep and reorder rows: new row i = old row rows[i]."""
        self.cache.select(rows)
