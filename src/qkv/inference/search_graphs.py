"""Recorded searches kept across batches: one fixed-shape decoder and graph per batch shape.

Recording a search as a CUDA graph (`graphed_search.py`) costs about as much as running it on a
batch of a few dozen sentences, and a graph only replays on the buffers it was recorded on. So
`SearchGraphs` pads each batch to one of a few shapes and keeps, per shape, the decoder, the
search state and the graph: the next batch of a known shape is encoded into the buffers that
the graph reads (`StaticDecoder.load`), and the graph replays.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from torch import Tensor

from qkv.data.batching import pad_ids, round_up
from qkv.data.special import BOS_ID, EOS_ID
from qkv.fast.graphs import on_side_stream
from qkv.inference.beam import Hypothesis, check_beam_size
from qkv.inference.graphed import StaticDecoder
from qkv.inference.graphed_search import FixedBeams, FixedGreedy
from qkv.inference.search import _check_lengths
from qkv.model.seq2seq import Seq2SeqTransformer


class SearchGraphs:
    """Recorded searches kept for the next batches: one decoder and graph per batch shape.

    Recording a search takes about as long as running it on a batch of a few dozen sentences.
    So batches are padded to a few shapes (rows to a multiple of `ROWS`, sources and steps to
    multiples of `LENGTHS`; padding rows decode a copy of the first source with a budget of
    0), and each shape's decoder and graph are kept: a new batch of a known shape is encoded
    into the buffers that the graph reads, and the graph replays. The `max_entries` most
    recently used shapes are kept; the memory of older ones is given back. Their graphs share
    one pool for their temporaries: they replay one at a time, and every search keeps its
    state in tensors of its own. A graph reads the
    weights where they were when it was recorded: training them in place is fine, but make a
    new `SearchGraphs` after casting or moving the model.

    Args:
        model: the translation model, in eval mode.
        max_entries: the most shapes kept at once.
        decoder_type: the fixed-shape decoder to make (a subclass may adjust the logits in
            `compute`).
    """

    ROWS = 8
    LENGTHS = 8

    def __init__(
        self,
        model: Seq2SeqTransformer,
        max_entries: int = 4,
        decoder_type: type[StaticDecoder] = StaticDecoder,
    ) -> None:
        self.model, self.max_entries, self.decoder_type = model, max_entries, decoder_type
        self.entries: OrderedDict[tuple[object, ...], FixedGreedy | FixedBeams] = OrderedDict()
        self.pool: Any = None  # the graphs' shared memory pool, from the first one

    def greedy(
        self, src_ids: Tensor, max_lengths: Tensor, bos_id: int = BOS_ID, eos_id: int = EOS_ID
    ) -> list[list[int]]:
        """`graphed_greedy_search` of sources (B, S) with budgets (B,) on their device."""
        kind = ("greedy", bos_id, eos_id)
        return self._search(src_ids, max_lengths, kind, 1, lambda d: FixedGreedy(d, bos_id, eos_id))

    def beam(
        self,
        src_ids: Tensor,
        beam_size: int,
        max_lengths: Tensor,
        alpha: float = 0.6,
        bos_id: int = BOS_ID,
        eos_id: int = EOS_ID,
    ) -> list[list[Hypothesis]]:
        """`graphed_beam_search` of sources (B, S) with budgets (B,) on their device."""
        check_beam_size(beam_size)
        kind = ("beam", alpha, bos_id, eos_id)
        return self._search(
            src_ids,
            max_lengths,
            kind,
            beam_size,
            lambda d: FixedBeams(d, beam_size, alpha, bos_id, eos_id),
        )

    def _search(
        self,
        src_ids: Tensor,
        max_lengths: Tensor,
        kind: tuple[object, ...],
        beam_size: int,
        make: Callable[[StaticDecoder], FixedGreedy | FixedBeams],
    ) -> list[Any]:
        """The search of this kind run on sources (B, S) with budgets (B,): one result per row.

        The search of the padded batch's shape is reused, its decoder loaded with these
        sources, or made. All of its GPU work, eager and replayed, runs on the side stream
        that graphs are recorded on, so that decoding uses one cuBLAS workspace."""
        batch = src_ids.size(0)
        _check_lengths(batch, max_lengths)
        if batch == 0:
            return []
        with on_side_stream(src_ids.device):
            src_ids, max_lengths = self._padded(src_ids, max_lengths)
            longest = max(int(max_lengths.max()), 1)
            steps = min(round_up(longest, self.LENGTHS), self.model.config.max_len)
            key = (*kind, beam_size, *src_ids.shape, steps)
            search = self.entries.pop(key, None)
            if search is None:
                while len(self.entries) >= self.max_entries:
                    self.entries.popitem(last=False)  # the least recently used shape
                rows = src_ids.size(0) * beam_size
                search = make(self.decoder_type(self.model, src_ids, steps, rows))
                search.pool = self.pool
            else:
                search.decoder.load(src_ids)
            self.entries[key] = search
            found = search.run(max_lengths)
        if self.pool is None and search.graph is not None:
            self.pool = search.graph.pool()
        return found[:batch]

    def _padded(self, src_ids: Tensor, max_lengths: Tensor) -> tuple[Tensor, Tensor]:
        """Rows and source positions up to the next multiples: (B', S') and (B',)."""
        batch, length = src_ids.shape
        rows = round_up(max(batch, 1), self.ROWS)
        padded = pad_ids(src_ids, rows, round_up(max(length, 1), self.LENGTHS))  # (B', S')
        padded[batch:, :length] = src_ids[:1]  # a real source: nothing decoded from it
        budgets = max_lengths.new_zeros(rows)  # (B',)
        budgets[:batch] = max_lengths
        return padded, budgets
