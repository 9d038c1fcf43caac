"""Adapter from a `Seq2SeqTransformer` and its KV cache to the search functions' decoder."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch
from torch import Tensor

from qkv import fast
from qkv.fast.decoding import frozen_for_decoding
from qkv.inference.output_layer import OutputLayer
from qkv.model.seq2seq import Seq2SeqTransformer


class DecodingWeights:
    """A model whose decoder and output layer are frozen for decoding, made once, at the first
    batch, for the `ModelDecoder`s of many batches (and workers). The frozen layers keep the
    weights as they were then: make a new one after the weights change (`translate_ids` makes
    one per call, a `Translator` one for its life). A model that `qkv.fast.apply` has not
    turned fast (or that `qkv.fast.reference` turned back) decodes with its own modules."""

    def __init__(self, model: Seq2SeqTransformer) -> None:
        self.model = model
        self._made: tuple[Seq2SeqTransformer, OutputLayer] | None = None
        self._made_for: set[tuple[torch.dtype, torch.device]] = set()
        self._making = threading.Lock()

    def frozen(self) -> tuple[Seq2SeqTransformer, OutputLayer]:
        """The model with its decoder frozen and the frozen output layer; made again if the
        model has moved to another dtype or device since (`model.double()`, say)."""
        with self._making:
            placed = {(p.dtype, p.device) for p in self.model.parameters()}
            if self._made is None or placed != self._made_for:
                made_fast = fast.applied(self.model)
                frozen = frozen_for_decoding(self.model) if made_fast else self.model
                self._made = frozen, OutputLayer(self.model.output, fast=made_fast)
                self._made_for = placed
            return self._made


class ModelDecoder:
    """Encodes source ids (B, S) once, then decodes step by step on a preallocated cache of
    `max_steps` positions (BOS included), with the frozen `weights` (by default made for this
    batch). `never` token ids get -inf logits."""

    def __init__(
        self,
        model: Seq2SeqTransformer,
        src_ids: Tensor,
        max_steps: int,
        never: Sequence[int] = (),
        weights: DecodingWeights | None = None,
    ) -> None:
        if weights is not None and weights.model is not model:
            raise ValueError("weights: the DecodingWeights of another model")
        weights = weights or DecodingWeights(model)
        frozen, output = weights.frozen()
        memory, src_mask, _ = frozen.encode(src_ids)  # (B, S, D), (B, 1, 1, S)
        self.cache = frozen.init_cache(memory, src_mask, max_steps)
        self.decoder, self.output = frozen.decoder, output.excluding(never)

    def step(self, tokens: Tensor) -> Tensor:
        """tokens (N,) -> next-token logits (N, V), in float32."""
        return self.output.logits(self._states(tokens)).float()  # (N, V)

    def step_argmax(self, tokens: Tensor) -> Tensor:
        """tokens (N,) -> the index of each row's largest next-token logit (N,) long."""
        return self.output.argmax(self._states(tokens))  # (N,)

    def _states(self, tokens: Tensor) -> Tensor:
        """tokens (N,) -> the decoder's states (N, D); the cache grows by one position."""
        return self.decoder.step(tokens[:, None], self.cache)[:, 0]  # (N, D)

    def select(self, rows: Tensor, held: Tensor | None = None) -> None:
        """As `IncrementalDecoder.select`."""
        self.cache.select(rows, held)
