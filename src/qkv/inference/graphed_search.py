"""Greedy and beam search whose steps never leave the device: one CUDA graph replay per step.

`search.py` and `beam.py` read each step's results on the host (which rows ended, which
hypotheses to keep, which rows to drop), so on a GPU every step waits for the device, and the
search's few dozen small kernels are launched one by one from Python between two replays of
the decoding step. Here the search's work is tensor operations at fixed shapes, recorded with
the decoding step (`StaticDecoder.compute`) as one graph, and the host only replays it:

- no row is ever dropped: a finished sentence keeps its rows, which are computed for nothing
  and change nothing (every update of results is masked by `done`);
- the tokens of each row and the step's position live in tensors on the device;
- beam search keeps each sentence's finished hypotheses in F = 3W slots of fixed tensors: a
  sentence is live while it holds fewer than W, and one step adds at most 2W (W ending in EOS,
  W more if it reaches its length budget);
- the host reads a single flag, "every sentence is done", every few steps.

`search_graphs.SearchGraphs` keeps the decoders and graphs of a few batch shapes for the next
batches, which is how `qkv translate` runs these searches on a GPU.

The rules and results are those of `search.greedy_search` and `beam.beam_search` (the same
tokens; equal scores may be ordered differently): see there. The tests check this on the CPU,
where the same steps run eagerly. The decoder is used up by a search: make one per batch.

Shapes follow the package alphabet (see `qkv.model`): B batch, W beam width, R = B * W rows,
V vocabulary size, T_max the steps the decoder holds, F finished slots per sentence.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from qkv.data.special import BOS_ID, EOS_ID
from qkv.fast.graphs import record
from qkv.inference.beam import (
    Hypothesis,
    _gather_beams,
    check_beam_size,
    length_penalty,
    topk_by_blocks,
)
from qkv.inference.graphed import StaticDecoder
from qkv.inference.search import _argmax, _check_lengths

CHECK_EVERY = 4
"""Steps between two looks at the "all done" flag (each look waits for the device)."""


def graphed_greedy_search(
    decoder: StaticDecoder,
    batch_size: int,
    max_lengths: Tensor,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
) -> list[list[int]]:
    """`search.greedy_search` (same arguments and result) with every step on the device, over
    a fresh `StaticDecoder` of R = B rows; with its `use_graph`, the steps are recorded and
    replayed as one CUDA graph."""
    _check_lengths(batch_size, max_lengths)
    return FixedGreedy(decoder, bos_id, eos_id).run(max_lengths)


def graphed_beam_search(
    decoder: StaticDecoder,
    batch_size: int,
    beam_size: int,
    max_lengths: Tensor,
    alpha: float = 0.6,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
) -> list[list[Hypothesis]]:
    """`beam.beam_search` (same arguments, result and errors) with every step on the device,
    over a fresh `StaticDecoder` of R = B * W rows, row i < B decoding source i (as made); with
    its `use_graph`, the steps are recorded and replayed as one CUDA graph."""
    check_beam_size(beam_size)
    _check_lengths(batch_size, max_lengths)
    return FixedBeams(decoder, beam_size, alpha, bos_id, eos_id).run(max_lengths)


class FixedShapeSearch:
    """What the fixed-shape searches share: a graph recorded at the first run, reset and
    replayed at every run."""

    def __init__(self, decoder: StaticDecoder, sentences: int) -> None:
        self.decoder = decoder
        self.graph: torch.cuda.CUDAGraph | None = None
        self.pool: Any = None  # the memory pool to record in, None for a new one
        device = decoder.tokens.device
        self.max_lengths = torch.zeros(sentences, dtype=torch.long, device=device)  # (B,)
        self.done = torch.zeros(sentences, dtype=torch.bool, device=device)  # (B,)

    def run(self, max_lengths: Tensor) -> list[Any]:
        """Search with budgets (B,) on the decoder's sources; results per sentence."""
        if max_lengths.shape != self.max_lengths.shape:
            raise ValueError(
                f"the search's decoder holds {self.max_lengths.numel()} sentences, "
                f"got {max_lengths.numel()} budgets"
            )
        steps = max(int(max_lengths.max()), 0) if max_lengths.numel() > 0 else 0
        if steps > self.decoder.cache.capacity:
            raise ValueError(
                f"a budget of {steps} tokens needs a decoder of {steps} steps, "
                f"got {self.decoder.cache.capacity}"
            )
        self.max_lengths.copy_(max_lengths)
        self.start()
        if self.decoder.use_graph and self.graph is None and steps > 0:
            self.graph, _ = record(self.advance, self.decoder.tokens.device, self.pool)
            self.reset()  # the warm-ups ran steps
        for step in range(1, steps + 1):
            if self.graph is None:
                self.advance()
            else:
                self.graph.replay()
            if step % CHECK_EVERY == 0 and bool(self.done.all()):
                break
        return self.results()

    def start(self) -> None:
        """Set up for new sources and budgets (host work allowed), then `reset`."""
        self.reset()

    def reset(self) -> None:
        """The state before the first step."""
        raise NotImplementedError

    def advance(self) -> None:
        """One step, on the device only."""
        raise NotImplementedError

    def results(self) -> list[Any]:
        raise NotImplementedError


class FixedGreedy(FixedShapeSearch):
    """A fixed-shape greedy search: `search._decode_paths` with finished rows masked."""

    def __init__(self, decoder: StaticDecoder, bos_id: int, eos_id: int) -> None:
        if decoder.rows != decoder.source_shape[0]:
            raise ValueError(
                f"the search needs a decoder of {decoder.source_shape[0]} rows, got {decoder.rows}"
            )
        super().__init__(decoder, decoder.rows)
        self.bos_id, self.eos_id = bos_id, eos_id
        rows, steps = decoder.rows, decoder.cache.capacity
        self.generated = torch.full((rows, steps), eos_id, device=self.done.device)  # (B, T_max)
        self.lengths = torch.zeros(rows, dtype=torch.long, device=self.done.device)  # (B,)

    def reset(self) -> None:
        self.lengths.zero_()
        self.done.copy_(self.max_lengths <= 0)
        self.decoder.tokens.fill_(self.bos_id)
        self.decoder.cache.position.zero_()

    def advance(self) -> None:
        position = self.decoder.cache.position  # (1,) the step being decoded
        tokens = _argmax(self.decoder.compute())  # (B,)
        steps = position + 1  # (1,) tokens generated, this one included
        ended = tokens == self.eos_id  # (B,)
        self.generated.index_copy_(1, position, tokens[:, None])  # read only up to `lengths`
        self.lengths.copy_(torch.where(self.done, self.lengths, steps - ended.long()))
        self.done.logical_or_(ended | (self.max_lengths <= steps))
        self.decoder.tokens.copy_(tokens)
        position.add_(1)

    def results(self) -> list[list[int]]:
        lengths = self.lengths.tolist()
        return [row[:n] for row, n in zip(self.generated.tolist(), lengths, strict=True)]


class FixedBeams(FixedShapeSearch):
    """A fixed-shape beam search (see the module docstring); `done` is per sentence."""

    def __init__(
        self, decoder: StaticDecoder, beam_size: int, alpha: float, bos_id: int, eos_id: int
    ) -> None:
        batch = decoder.source_shape[0]
        if decoder.rows != batch * beam_size:
            raise ValueError(
                f"the search needs a decoder of {batch * beam_size} rows, got {decoder.rows}"
            )
        super().__init__(decoder, batch)
        self.width, self.alpha, self.bos_id, self.eos_id = beam_size, alpha, bos_id, eos_id
        device, capacity = self.done.device, decoder.cache.capacity
        slots = 3 * beam_size + 1  # F, then one slot that takes what is not kept
        self.scores = torch.zeros(batch, beam_size, device=device)  # (B, W)
        self.history = torch.zeros(batch, beam_size, capacity, dtype=torch.long, device=device)
        self.count = torch.zeros(batch, dtype=torch.long, device=device)  # (B,)
        self.final_log_probs = torch.zeros(batch, slots, device=device)  # (B, F + 1)
        self.final_steps = torch.zeros(batch, slots, dtype=torch.long, device=device)
        self.final_lengths = torch.zeros(batch, slots, dtype=torch.long, device=device)
        self.final_tokens = torch.zeros(
            batch, slots, capacity, dtype=torch.long, device=device
        )  # (B, F + 1, T_max)
        self.first_row = torch.arange(batch, device=device)[:, None] * beam_size  # (B, 1)

    def start(self) -> None:
        """Each sentence's W rows decode its source from the start, beams 1..W-1 empty."""
        batch = self.max_lengths.numel()
        sources = torch.arange(batch, device=self.done.device).repeat_interleave(self.width)
        self.decoder.select(sources)  # (R,)
        self.reset()

    def reset(self) -> None:
        self.scores.fill_(-torch.inf)
        self.scores[:, 0] = 0.0
        self.done.copy_(self.max_lengths <= 0)  # nothing to generate: one empty hypothesis
        self.count.copy_(self.done.long())
        for final in (self.final_log_probs, self.final_steps, self.final_lengths):
            final[:, 0] = 0
        self.decoder.tokens.fill_(self.bos_id)
        self.decoder.cache.position.zero_()

    def advance(self) -> None:
        """One step: extend, finalise, prune (`beam._advance`, done sentences masked)."""
        width, position = self.width, self.decoder.cache.position  # W, (1,)
        logits = self.decoder.compute()  # (R, V)
        batch, vocab_size = self.scores.size(0), logits.size(-1)
        candidates = logits.log_softmax(dim=-1).view(batch, width, vocab_size)  # (B, W, V)
        candidates = candidates.add_(self.scores[..., None]).view(batch, width * vocab_size)
        top_scores, top_index = topk_by_blocks(candidates, 2 * width)  # (B, 2W)
        top_beams, top_tokens = top_index // vocab_size, top_index % vocab_size  # (B, 2W)
        is_eos = top_tokens == self.eos_id  # (B, 2W)

        chosen = is_eos.long().argsort(dim=1, stable=True)[:, :width]  # (B, W)
        next_beams = top_beams.gather(1, chosen)  # (B, W)
        next_scores = top_scores.gather(1, chosen).masked_fill(is_eos.gather(1, chosen), -torch.inf)
        next_tokens = top_tokens.gather(1, chosen)  # (B, W)
        histories = _gather_beams(self.history, next_beams)  # (B, W, T_max)
        histories.index_copy_(2, position, next_tokens[..., None])

        live = ~self.done  # (B,)
        steps = position + 1  # (1,) tokens generated, EOS included
        ending = is_eos[:, :width] & top_scores[:, :width].isfinite() & live[:, None]  # (B, W)
        at_limit = (self.max_lengths <= steps) & live  # (B,)
        at_limit_beams = at_limit[:, None] & next_scores.isfinite()  # (B, W)
        eos_prefixes = _gather_beams(self.history, top_beams[:, :width])  # (B, W, T_max)
        self._finalise(
            torch.cat([ending, at_limit_beams], dim=1),  # (B, 2W)
            torch.cat([top_scores[:, :width], next_scores], dim=1),
            torch.cat([eos_prefixes, histories], dim=1),  # (B, 2W, T_max)
            torch.cat([position.expand_as(ending), steps.expand_as(ending)], dim=1),
            steps,
        )
        full = self.count >= width  # (B,)
        stuck = ~next_scores.isfinite().any(dim=1)  # (B,) no live beam is left
        self.done.logical_or_(full | at_limit | stuck)

        self.scores.copy_(next_scores)
        self.history.copy_(histories)
        self.decoder.reorder((self.first_row + next_beams).view(-1))  # (R,)
        self.decoder.tokens.copy_(next_tokens.view(-1))
        position.add_(1)

    def _finalise(
        self, mask: Tensor, log_probs: Tensor, tokens: Tensor, lengths: Tensor, steps: Tensor
    ) -> None:
        """Store the candidates picked by `mask` (B, 2W) in their sentence's next free slots,
        in order; the others go to the last slot, which is never read."""
        spare = self.final_log_probs.size(1) - 1
        slots = self.count[:, None] + mask.long().cumsum(dim=1) - 1  # (B, 2W)
        slots = torch.where(mask, slots, spare)  # (B, 2W)
        self.final_log_probs.scatter_(1, slots, log_probs)
        self.final_lengths.scatter_(1, slots, lengths)
        self.final_steps.scatter_(1, slots, steps.expand_as(slots))
        self.final_tokens.scatter_(1, slots[..., None].expand_as(tokens), tokens)
        self.count.add_(mask.sum(dim=1))

    def results(self) -> list[list[Hypothesis]]:
        """Each sentence's finished hypotheses, best first, at most W (`beam_search`'s)."""
        found = []
        for count, log_probs, steps, lengths, tokens in zip(
            self.count.tolist(),
            self.final_log_probs.tolist(),
            self.final_steps.tolist(),
            self.final_lengths.tolist(),
            self.final_tokens.tolist(),
            strict=True,
        ):
            hyps = [
                Hypothesis(
                    tokens[k][: lengths[k]],
                    log_probs[k] / length_penalty(steps[k], self.alpha),
                    log_probs[k],
                )
                for k in range(count)
            ]
            found.append(sorted(hyps, key=lambda h: h.score, reverse=True)[: self.width])
        return found
