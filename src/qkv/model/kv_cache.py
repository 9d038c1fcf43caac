"""Caches for incremental decoding.

Decoder self-attention keys/values live in a preallocated `KVCache` per layer that grows by one
step at a time, so the prefix is never recomputed. Cross-attention keys/values depend only on the
source, so they are computed once per source and kept in the `DecoderCache`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
from torch import Tensor


class SelfAttentionCache(Protocol):
    """What a self-attention layer needs from its cache while decoding."""

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store new keys/values (N, H, t, K); return the keys and values to attend to."""


class KVCache:
    """Preallocated keys and values of one self-attention layer.

    The buffers are step-major, (T_max, N, H, K): an append writes one block, and the steps
    filled so far form one dense block for the batched products over the cache. `keys` and
    `values` are (N, H, T_max, K) views, whose N and H merge without a copy. Reordering rows
    copies only the steps a row's new place lacks (`changed_steps`), one (H · K) block each.

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
        """Keep and reorder rows in place: new row i = old row rows[i] (rows (N',) long).

        Only rows that change (rows[i] != i) are written, and only the steps filled so far;
        beam search keeps most rows in place. `steps` (`changed_steps`, for at most
        `rows_held` rows) narrows the copy to the steps that change.
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
    """The steps to copy when reordering `rows` in step-major buffers of `rows_held` rows
    holding `length` steps: for each row i with rows[i] != i, steps held[i] onward, where held
    (N',) long counts the leading steps that place i already shares with old row rows[i]."""
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
class SourceKV:
    """Cross-attention keys and values of one decoder layer, computed once per source.

    Attributes:
        keys, values: (G, H, S, K) each, one entry per source (see `DecoderCache`).
    """

    keys: Tensor
    values: Tensor


@dataclass
class DecoderCache:
    """Everything a decoder needs between steps.

    Cross-attention keys and values depend on the source alone, so rows that decode the same
    source (the W beams of a sentence) share them: the rows form G groups of `group_size`
    consecutive rows, and group g reads entry g of the cross-attention tensors. A group's rows
    then attend as that many queries of one sentence, reading its keys and values once.

    Attributes:
        self_attn: one KVCache per decoder layer, N rows.
        source: one SourceKV per decoder layer, G entries.
        src_mask: (G, 1, 1, S) bool, True = real source token.
        group_size: N / G, 1 when each row has its own entry (as at the start).
    """

    self_attn: list[KVCache]
    source: list[SourceKV]
    src_mask: Tensor
    group_size: int = 1

    @property
    def length(self) -> int:
        """Number of target positions decoded so far."""
        return self.self_attn[0].length if self.self_attn else 0

    @property
    def rows(self) -> int:
        return self.src_mask.size(0) * self.group_size

    def select(self, rows: Tensor, held: Tensor | None = None) -> None:
        """Keep and reorder rows: new row i = old row rows[i] (beam reordering and expansion,
        dropping finished sentences).

        `held` (N',) long, if given, counts the leading steps that place i already shares with
        old row rows[i] (beam siblings share most of their past); only later steps are copied
        (`changed_steps`, computed once for all layers).
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
        tensors = [t for kv in self.source for t in (kv.keys, kv.values)]
        if count <= entries_before and not tensors[0].requires_grad:
            # At most as many entries (finished sentences dropped): moved in place, if at all.
            move_rows([*tensors, self.src_mask], groups)
            self._keep(slice(0, count))  # a new mask object: what reads it sees it changed
        elif not torch.equal(groups, torch.arange(entries_before, device=groups.device)):
            self._keep(groups)

    def _keep(self, entries: Tensor | slice) -> None:
        """Keep the cross-attention entries `entries` (an index or a leading slice)."""
        for kv in self.source:
            kv.keys, kv.values = kv.keys[entries], kv.values[entries]  # (G', H, S, K)
        self.src_mask = self.src_mask[entries]  # (G', 1, 1, S)


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
