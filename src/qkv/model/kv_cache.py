"""Caches for incremental decoding.

Decoder self-attention keys/values live in a preallocated `KVCache` per layer that grows by one
step at a time, so the prefix is never recomputed. Cross-attention keys/values depend only on the
source, so they are computed once per source and kept in the `DecoderCache`.

`StaticDecoderCache` holds the same things in tensors whose shapes never change from one step to
the next, the step position included, so that a whole decoding step can be recorded once as a
CUDA graph and replayed (see `qkv.inference.graphed`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import torch
from torch import Tensor


class SelfAttentionCache(Protocol):
    """What a self-attention layer needs from its cache while decoding."""

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store new keys/values (N, H, t, K); return the keys and values to attend to."""


class KVCache:
    """Preallocated keys and values of one self-attention layer.

    The buffers are step-major, (T_max, N, H, K): a step's keys for all rows lie side by side,
    so that an append writes one block, and the steps filled so far are one dense block, which
    the batched products over the cache read with no gaps. `keys` and `values` are
    (N, H, T_max, K) views of them, whose N and H merge without a copy. Against row-major
    (N, H, T_max, K) buffers, whose rows hold T_max steps however few are filled, decoding of
    the benchmark was 1.04× as fast greedy, 1.09× beam-5 (`benchmarks/frozen_ab.py --change
    step-major`; beam search's rows moved whole there). Beam search's reordering copies only
    the steps that a row's new place does not hold already (`changed_steps`), each step of a
    row one (H · K) block.

    Args:
        rows: N, the number of sequences decoded together.
        n_heads, head_dim: H and K.
        max_len: the most steps that will be appended.
    """

    def __init__(
        self,
        rows: int,
        n_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | None = None,
    ) -> None:
        shape = (max_len, rows, n_heads, head_dim)  # (T_max, N_max, H, K)
        # Rows live in the first N rows of buffers that grow only when N does (beam expansion).
        self._all_keys = torch.empty(shape, dtype=dtype, device=device).permute(1, 2, 0, 3)
        self._all_values = torch.empty(shape, dtype=dtype, device=device).permute(1, 2, 0, 3)
        # Both (N_max, H, T_max, K) views of step-major buffers.
        self.keys = self._all_keys  # (N, H, T_max, K)
        self.values = self._all_values  # (N, H, T_max, K)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.keys.size(2)

    @property
    def rows_held(self) -> int:
        """N_max: the most rows the buffers hold before they must grow."""
        return self._all_keys.size(0)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store new keys/values (N, H, t, K); return all cached so far (N, H, length, K)."""
        steps = k.size(2)
        if self.length + steps > self.capacity:
            raise RuntimeError(f"KV cache full: {self.length} + {steps} > {self.capacity} steps")
        end = self.length + steps
        self.keys[:, :, self.length : end] = k
        self.values[:, :, self.length : end] = v
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]  # (N, H, length, K)

    def select(self, rows: Tensor, steps: ChangedSteps | None = None) -> None:
        """Keep and reorder rows: new row i = old row rows[i] (rows (N',) long).

        In place: only the rows that change (rows[i] != i) are written, and only the steps
        filled so far. Beam search arranges its beams so that most rows stay where they are.
        `steps` (`changed_steps`, for no more rows than `rows_held`) narrows the copy down to
        the steps that change.
        """
        if self.keys.requires_grad:  # decoding under autograd: in-place copies are not allowed
            self.keys, self.values = self.keys[rows], self.values[rows]  # (N', H, T_max, K)
            return
        count, end = rows.numel(), self.length
        if count > self.rows_held:  # more rows than ever: new buffers
            keys, values = self._empty(count), self._empty(count)  # (N', H, T_max, K) each
            keys[:, :, :end] = self.keys[:, :, :end].index_select(0, rows)
            values[:, :, :end] = self.values[:, :, :end].index_select(0, rows)
            self._all_keys, self._all_values = keys, values
        elif steps is not None:
            for buffer in (self._all_keys, self._all_values):
                units = _step_rows(buffer)  # (T_max · N_max, H · K)
                units.index_copy_(0, steps.to, units.index_select(0, steps.source))
        else:
            filled = [buffer[:, :, :end] for buffer in (self._all_keys, self._all_values)]
            move_rows(filled, rows)  # (N_max, H, length, K) each
        self.keys, self.values = self._all_keys[:count], self._all_values[:count]

    def _empty(self, rows: int) -> Tensor:
        """A new step-major buffer for `rows` rows, seen as (N, H, T_max, K)."""
        _, heads, capacity, width = self._all_keys.shape
        return self._all_keys.new_empty(capacity, rows, heads, width).permute(1, 2, 0, 3)


def _step_rows(buffer: Tensor) -> Tensor:
    """A step-major buffer seen as (N, H, T_max, K) -> its (T_max · N, H · K) view: one row
    per step of each row."""
    rows, heads, capacity, width = buffer.shape
    return buffer.permute(2, 0, 1, 3).view(capacity * rows, heads * width)


class ChangedSteps(NamedTuple):
    """Steps of step-major (T_max, N, H, K) buffers, as indices (U,) long into their
    (T_max · N, H · K) views: where each goes (`to`) and where it comes from (`source`)."""

    to: Tensor
    source: Tensor


def changed_steps(rows: Tensor, held: Tensor, length: int, rows_held: int) -> ChangedSteps:
    """The steps that reordering `rows` changes in step-major buffers of `rows_held` rows that
    hold `length` steps: those of each row i with rows[i] != i, from step held[i] on (held
    (N',) long: the leading steps that place i already holds equal to those of old row
    rows[i])."""
    count = rows.numel()
    moved = ((rows != torch.arange(count, device=rows.device)) & (held < length)).nonzero()
    moved = moved.squeeze(1)  # (C,) the rows that change
    starts = held[moved].clamp(min=0)  # (C,)
    counts = length - starts  # (C,) steps to copy of each
    total = int(counts.sum())
    each = torch.repeat_interleave(counts, output_size=total)  # (S,) its row among the C
    first = counts.cumsum(0) - counts  # (C,) where a row's steps start among the S
    steps = torch.arange(total, device=rows.device) + (starts - first)[each]  # (S,)
    at = steps * rows_held  # (S,) where each step's rows start
    return ChangedSteps(at + moved[each], at + rows[moved][each])


@dataclass
class DecoderCache:
    """Everything a decoder needs between steps.

    Cross-attention keys and values depend on the source alone, so rows that decode the same
    source (the W beams of a sentence) share them: the rows form G groups of `group_size`
    consecutive rows, and group g reads entry g of the cross-attention tensors. A group's rows
    then attend as that many queries of one sentence, reading its keys and values once.

    Attributes:
        self_attn: one KVCache per decoder layer, N rows.
        cross_keys, cross_values: one (G, H, S, K) tensor per decoder layer.
        src_mask: (G, 1, 1, S) bool, True = real source token.
        group_size: N / G, 1 when each row has its own entry (as at the start).
        empty_sources: whether a source had no real token at all (read once, here).
    """

    self_attn: list[KVCache]
    cross_keys: list[Tensor]
    cross_values: list[Tensor]
    src_mask: Tensor
    group_size: int = 1
    empty_sources: bool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        mask = self.src_mask  # (G, 1, 1, S)
        heads = self.cross_keys[0].size(1) if self.cross_keys else 1
        dtype = self.cross_keys[0].dtype if self.cross_keys else torch.float32
        # `src_mask` as `source_bias` reads it, made once and moved with it by `select`.
        self._bias = mask.new_zeros(mask.size(0), heads, 1, mask.size(3), dtype=dtype)
        self._bias.masked_fill_(~mask, float("-inf"))  # (G, H, 1, S)
        self.empty_sources = not bool(mask.any(dim=-1).all())

    @property
    def length(self) -> int:
        """Number of target positions decoded so far."""
        return self.self_attn[0].length if self.self_attn else 0

    @property
    def rows(self) -> int:
        return self.src_mask.size(0) * self.group_size

    @property
    def source_bias(self) -> Tensor:
        """(G * H, 1, S), the source mask as cross-attention adds it to its scores: 0 at real
        source tokens, -inf at padding."""
        return self._bias.flatten(0, 1)

    def select(self, rows: Tensor, held: Tensor | None = None) -> None:
        """Keep and reorder rows: new row i = old row rows[i] (beam reordering and expansion,
        dropping finished sentences).

        `held` (N',) long, where given: the leading steps that place i already holds equal to
        those of old row rows[i] (a beam's siblings share most of their past). Only the steps
        from there on are copied (`changed_steps`, worked out once for all layers): beam-5
        decoding of the benchmark copied 23 % of the steps that whole rows hold (counted in a
        scratch run), and was 1.09× as fast (`benchmarks/frozen_ab.py --change held`).
        """
        steps: ChangedSteps | None = None
        first = self.self_attn[0] if self.self_attn else None
        if held is not None and first is not None and rows.numel() <= first.rows_held:
            steps = changed_steps(rows, held, first.length, first.rows_held)
        for cache in self.self_attn:
            cache.select(rows, steps)
        entries = torch.div(rows, self.group_size, rounding_mode="floor")  # (N',) entry per row
        groups, counts = torch.unique_consecutive(entries, return_counts=True)  # (G',), (G',)
        group_size = int(counts[0]) if counts.numel() > 0 else 1
        if not bool((counts == group_size).all()):  # not runs of equal length: one entry per row
            groups, group_size = entries, 1
        self.group_size = group_size
        count, entries_before = groups.numel(), self.src_mask.size(0)
        if count <= entries_before and not self.cross_keys[0].requires_grad:
            # As many entries or fewer (finished sentences dropped): moved in place, and
            # nothing at all when every group reads the entry it read before.
            move_rows([*self.cross_keys, *self.cross_values, self.src_mask, self._bias], groups)
            if count < entries_before:
                self.cross_keys = [k[:count] for k in self.cross_keys]  # (G', H, S, K)
                self.cross_values = [v[:count] for v in self.cross_values]  # (G', H, S, K)
                self.src_mask = self.src_mask[:count]  # (G', 1, 1, S)
                self._bias = self._bias[:count]  # (G', H, 1, S)
            return
        if torch.equal(groups, torch.arange(entries_before, device=groups.device)):
            return  # every group reads the entry it read before (beams reordered in place)
        self.cross_keys = [k[groups] for k in self.cross_keys]  # (G', H, S, K)
        self.cross_values = [v[groups] for v in self.cross_values]  # (G', H, S, K)
        self.src_mask = self.src_mask[groups]  # (G', 1, 1, S)
        self._bias = self._bias[groups]  # (G', H, 1, S)


def first_sources(batch: int, rows: int, device: torch.device) -> Tensor:
    """(R,) long, the source of each row of a fresh fixed-shape cache: row i < B decodes source
    i, the rows beyond hold copies of source 0 until `select` fills them."""
    return torch.cat([torch.arange(batch), torch.zeros(rows - batch, dtype=torch.long)]).to(device)


def move_rows(tensors: list[Tensor], rows: Tensor) -> None:
    """In place, in each tensor: row i becomes old row rows[i], for i < N' (rows (N',) long).

    Only the rows that change (rows[i] != i) are written; rows from N' on are left as they are.
    """
    moved = (rows != torch.arange(rows.numel(), device=rows.device)).nonzero().squeeze(1)  # (C,)
    if moved.numel() == 0:
        return
    sources = rows[moved]  # (C,) gathered first: a source may also be a destination
    for tensor in tensors:
        tensor.index_copy_(0, moved, tensor.index_select(0, sources))


class StaticKVCache:
    """Keys and values of one self-attention layer at fixed shapes: every step reads all T_max.

    The step writes its keys and values at `position`, a tensor, and attends to the whole
    buffer under the mask of `StaticDecoderCache.self_mask`; the buffers start at zero so that
    the positions not yet written hold finite numbers (their weights are exactly zero).

    Args:
        rows: R, the most rows decoded together.
        n_heads, head_dim: H and K.
        max_len: T_max, the most steps.
        position: (1,) long, the step being decoded, shared by all layers.
    """

    def __init__(
        self,
        rows: int,
        n_heads: int,
        head_dim: int,
        max_len: int,
        position: Tensor,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        shape = (rows, n_heads, max_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=position.device)  # (R, H, T_max, K)
        self.values = torch.zeros(shape, dtype=dtype, device=position.device)  # (R, H, T_max, K)
        self.position = position

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the step's keys/values (R, H, 1, K) at `position`; return all (R, H, T_max, K)."""
        self.keys.index_copy_(2, self.position, k.to(self.keys.dtype))
        self.values.index_copy_(2, self.position, v.to(self.values.dtype))
        return self.keys, self.values


@dataclass
class StaticDecoderCache:
    """Everything a decoding step reads, at shapes fixed for the whole batch.

    R rows, each with its own entry of the cross-attention tensors (a row of the W beams of a
    sentence holds a copy of the sentence's). Rows beyond those in use hold stale numbers and
    are computed for nothing; `select` moves rows as `DecoderCache.select` does.

    Attributes:
        self_attn: one StaticKVCache per decoder layer.
        cross_keys, cross_values: one (R, H, S, K) tensor per decoder layer.
        src_mask: (R, 1, 1, S) bool, True = real source token.
        position: (1,) long, the step being decoded (0 for the first token fed).
        length: the number of steps decoded so far, as a Python int (the host's count).
    """

    self_attn: list[StaticKVCache]
    cross_keys: list[Tensor]
    cross_values: list[Tensor]
    src_mask: Tensor
    position: Tensor
    length: int = 0
    steps: Tensor = field(init=False, repr=False)  # (T_max,) 0, 1, ..., made once

    def __post_init__(self) -> None:
        self.steps = torch.arange(self.capacity, device=self.position.device)

    @property
    def capacity(self) -> int:
        return self.self_attn[0].keys.size(2)

    @property
    def rows(self) -> int:
        return self.src_mask.size(0)

    def self_mask(self) -> Tensor:
        """(1, 1, 1, T_max) bool: the positions written so far, this step's included."""
        return (self.steps <= self.position).view(1, 1, 1, -1)

    def select(self, rows: Tensor) -> None:
        """Keep and reorder rows: new row i = old row rows[i] (rows (N',) long, N' <= R)."""
        if rows.numel() > self.rows:
            raise RuntimeError(f"{rows.numel()} rows asked of a cache made for {self.rows}")
        filled = [
            buffer[:, :, : self.length]
            for cache in self.self_attn
            for buffer in (cache.keys, cache.values)
        ]  # (R, H, length, K) each
        move_rows([*filled, *self.cross_keys, *self.cross_values, self.src_mask], rows)

    def load_sources(self, cross: list[tuple[Tensor, Tensor]], src_mask: Tensor) -> None:
        """Put new sources in place of the old, in the same buffers (a recorded graph still
        reads them), rows as `Seq2SeqTransformer.init_static_cache` lays them out.

        Args:
            cross: each layer's cross-attention keys and values (B, H, S, K), the B and S
                of the old sources.
            src_mask: (B, 1, 1, S) bool, True = real source token.
        """
        fill = first_sources(src_mask.size(0), self.rows, src_mask.device)  # (R,)
        for keys, values, (k, v) in zip(self.cross_keys, self.cross_values, cross, strict=True):
            keys.copy_(k[fill])  # (R, H, S, K)
            values.copy_(v[fill])  # (R, H, S, K)
        self.src_mask.copy_(src_mask[fill])  # (R, 1, 1, S)
        self.length = 0

    def gather_self_attention(self, rows: Tensor) -> None:
        """Reorder the self-attention rows: new row i = old row rows[i] (rows (R,) long).

        Every row and position is gathered, so the work and the shapes never change and no
        count is read on the host (a step recorded as a CUDA graph can do it). The
        cross-attention tensors are left as they are: each row must keep its source.
        """
        for cache in self.self_attn:
            cache.keys.copy_(cache.keys.index_select(0, rows))  # (R, H, T_max, K)
            cache.values.copy_(cache.values.index_select(0, rows))  # (R, H, T_max, K)
