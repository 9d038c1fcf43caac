"""A translation model's decoder made fast for CPU decoding steps, its parameters shared: linear
layers frozen (`FrozenLinear`), attention over the cache as two batched products (at one query
per row the fused kernel costs more than it saves).
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import Tensor

from qkv.fast.frozen_linear import FrozenLinear, frozen_copy
from qkv.model.attention import MultiHeadAttention
from qkv.model.layers import FeedForward
from qkv.model.seq2seq import Seq2SeqTransformer


class StepAttention(MultiHeadAttention):
    """`MultiHeadAttention` whose attention is two batched products, for decoding steps."""

    _biases: dict[int, tuple[Tensor, Tensor, bool]]

    def project(self, x: Tensor, first: int, last: int) -> Tensor:
        if first == 0 and isinstance(self.in_proj, FrozenLinear):  # queries, at every step
            return self.in_proj.part(0, last * self.d_model)(x)
        return super().project(x, first, last)

    def attend_heads(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        if need_weights or self.training or (mask is not None and mask.size(-2) > 1):
            return super().attend_heads(q, k, v, mask, need_weights)
        batch, heads, length, head_dim = q.shape
        n_keys = k.size(2)
        queries = q.reshape(batch * heads, length, head_dim)  # (B * H, T, K)
        keys = k.reshape(batch * heads, n_keys, head_dim).transpose(1, 2)  # (B * H, K, S)
        scale = 1.0 / math.sqrt(head_dim)
        no_bias = q.new_zeros(()), False  # adding 0 changes no score
        bias, guard = no_bias if mask is None else self._bias(mask, heads, q.dtype)  # (B*H, 1, S)
        scores = torch.baddbmm(bias, queries, keys, alpha=scale)  # (B * H, T, S)
        weights = torch.softmax(scores, dim=-1)  # (B * H, T, S)
        if guard:  # a source with no real token: zeros, as the reference gives
            weights = weights.nan_to_num(0.0)
        context = torch.bmm(weights, v.reshape(batch * heads, n_keys, head_dim))  # (B*H, T, K)
        merged = self.merge_heads(context.view(batch, heads, length, head_dim))  # (B, T, D)
        return self.out_proj(merged), None

    def _bias(self, mask: Tensor, heads: int, dtype: torch.dtype) -> tuple[Tensor, bool]:
        """The mask (B, 1, 1, S) as a scores bias (B * H, 1, S) of 0 or -inf, and whether a row
        has no real source token; cached for a few masks (batches decoded in threads)."""
        made = self._biases.get(id(mask))
        if made is None or made[0] is not mask:
            bias = torch.zeros(mask.size(0), heads, 1, mask.size(-1), dtype=dtype)
            bias = bias.to(mask.device).masked_fill_(~mask, float("-inf")).flatten(0, 1)
            made = mask, bias, not bool(mask.any(dim=-1).all())
            if len(self._biases) >= 8:
                self._biases.clear()
            self._biases[id(mask)] = made
        return made[1], made[2]


class StepFeedForward(FeedForward):
    """`FeedForward` whose ReLU oneDNN applies as it writes the first product."""

    def forward(self, x: Tensor) -> Tensor:
        if isinstance(self.linear1, FrozenLinear) and isinstance(self.activation, torch.nn.ReLU):
            return self.linear2(self.dropout(self.linear1(x, relu=True)))  # (..., D)
        return super().forward(x)


def frozen_for_decoding(model: Seq2SeqTransformer) -> Seq2SeqTransformer:
    """A copy of `model` in eval mode for decoding steps, sharing its parameters."""
    twin = frozen_copy(model, keep=("encoder", "output"))
    for module in twin.decoder.modules():
        if isinstance(module, MultiHeadAttention):
            module.__class__ = StepAttention
            cast(StepAttention, module)._biases = {}
        elif isinstance(module, FeedForward):
            module.__class__ = StepFeedForward
    return twin
