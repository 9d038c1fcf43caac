"""Greedy decoding and sampling over an incremental decoder, one path per sentence; finished
rows leave the decoder. Shapes: B batch, V vocabulary size, N rows live in the decoder.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import Tensor

from qkv.data.special import BOS_ID, EOS_ID, PAD_ID
from qkv.errors import ConfigError


class IncrementalDecoder(Protocol):
    """A decoder holding its own state (KV cache, memory, source mask) for N rows; it starts
    with N = B rows, one per source sentence, before any token is fed. One that finds the
    argmax of its logits faster than the logits also has `step_argmax(tokens)`, tokens (N,)
    -> `step(tokens).argmax(-1)` (N,) long, which greedy search then takes."""

    def step(self, tokens: Tensor) -> Tensor:
        """tokens (N,) long, the last of every live row -> next-token logits (N, V)."""

    def select(self, rows: Tensor, held: Tensor | None = None) -> None:
        """Keep and reorder rows: new row i = old row rows[i] (N',) long. `held` (N',) long, a
        hint: how many tokens fed (BOS first) place i shares with old row rows[i]."""


def greedy_search(
    decoder: IncrementalDecoder, batch_size: int, max_lengths: Tensor
) -> list[list[int]]:
    """B lists of token ids (no BOS, EOS), always the most probable next token; `max_lengths`
    (B,) long, on the decoder's device: each sentence's budget of tokens, EOS included."""
    step_argmax: Callable[[Tensor], Tensor] = getattr(decoder, "step_argmax", None) or (
        lambda tokens: first_argmax(decoder.step(tokens))
    )  # tokens (N,) -> next tokens (N,)
    return _decode_paths(decoder, batch_size, max_lengths, lambda tokens, _: step_argmax(tokens))


def sample(
    decoder: IncrementalDecoder,
    batch_size: int,
    max_lengths: Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    seeds: Sequence[int] | None = None,
) -> list[list[int]]:
    """Decode every sentence by drawing each next token from the logits divided by
    `temperature` and cut by `filter_logits`, never padding or BOS. Each sentence draws from a
    stream seeded by its entry of `seeds` (else drawn from `generator`), whatever the batch.

    Raises ConfigError for temperature, top_k or top_p out of range, ValueError unless `seeds`
    holds B seeds.
    """
    check_sampling(temperature, top_k, top_p)
    check_lengths(batch_size, max_lengths)
    if seeds is None:
        if generator is not None and generator.device.type != "cpu":  # seeds a CPU generator
            seed = torch.randint(2**62, (1,), generator=generator, device=generator.device)
            generator = torch.Generator().manual_seed(int(seed))
        seeds = torch.randint(2**62, (batch_size,), generator=generator).tolist()
    elif len(seeds) != batch_size:
        raise ValueError(f"seeds must hold {batch_size} seeds, one per sentence, got {len(seeds)}")
    # Drawn on the CPU whatever the device: on a GPU each row's draw would be a launch of its own.
    streams = [torch.Generator().manual_seed(int(seed)) for seed in seeds]
    never: Tensor | None = None  # (k,) ids that are not words

    def draw(tokens: Tensor, sentences: Tensor) -> Tensor:
        nonlocal never
        logits = decoder.step(tokens)  # (N, V)
        if never is None:
            ids = [i for i in (PAD_ID, BOS_ID) if i < logits.size(-1)]
            never = torch.tensor(ids, dtype=torch.long, device=logits.device)
        words = logits.index_fill(-1, never, -math.inf)  # (N, V)
        # The best shifted to 0 before dividing: a tiny temperature sends the rest to -inf,
        # not the best to +inf (a NaN softmax); it is kept within the dtype's normal numbers
        # (one beyond its largest would divide by inf: NaN again).
        finfo = torch.finfo(words.dtype)
        kept = min(max(temperature, finfo.tiny), finfo.max)
        scaled = (words - words.amax(dim=-1, keepdim=True)) / kept  # (N, V)
        cdf = filter_logits(scaled, top_k, top_p).softmax(dim=-1).cumsum(dim=-1)  # (N, V)
        draws = [torch.rand(1, generator=streams[s]) for s in sentences.tolist()]
        uniform = torch.cat(draws).to(logits.device)  # (N,) in [0, 1), one per row's stream
        # The first token whose cumulative probability reaches a point in (0, total]: never
        # one of probability 0.
        point = ((1.0 - uniform) * cdf[:, -1]).to(cdf.dtype).unsqueeze(1)  # (N, 1)
        return torch.searchsorted(cdf, point).squeeze(1)  # (N,)

    return _decode_paths(decoder, batch_size, max_lengths, draw)


def filter_logits(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """logits (N, V) -> a copy with -inf outside the top-k (0 keeps all) and outside the
    nucleus: the smallest set of most probable tokens (after top-k) of mass >= top_p in (0, 1].
    """
    check_sampling(1.0, top_k, top_p)
    if 0 < top_k < logits.size(-1):
        kept = logits.topk(top_k, dim=-1).indices  # (N, k)
        keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, kept, True)  # (N, V)
        logits = logits.masked_fill(~keep, -math.inf)  # (N, V)
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (N, V), (N, V)
        probs = sorted_logits.softmax(dim=-1)  # (N, V)
        # A token is dropped once the more probable ones already reach p.
        drop_sorted = probs.cumsum(dim=-1) - probs >= top_p  # (N, V)
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # (N, V)
        logits = logits.masked_fill(drop, -math.inf)  # (N, V)
    return logits


def rows_to_keep(live: Tensor) -> Tensor:
    """live (N,) bool -> the rows (N',) long that go on, as `select` takes them: those among
    the first N' stay put, the ones beyond fill the finished rows' places."""
    count = int(live.sum())
    rows = torch.arange(count, device=live.device)  # (N',)
    holes = (~live[:count]).nonzero().squeeze(1)  # (F,) finished rows among the first N'
    rows[holes] = live[count:].nonzero().squeeze(1) + count  # (F,) live rows beyond them
    return rows


def check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """Raise ConfigError unless 0 < temperature < inf, top_k >= 0 and 0 < top_p <= 1."""
    if not 0 < temperature < math.inf:  # NaN fails too
        raise ConfigError(f"temperature must be a number > 0, got {temperature}")
    if top_k < 0:
        raise ConfigError(f"top_k must be >= 0, got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p must be in (0, 1], got {top_p}")


def check_lengths(batch_size: int, max_lengths: Tensor) -> None:
    if not isinstance(max_lengths, Tensor) or max_lengths.dtype != torch.long:
        kind = max_lengths.dtype if isinstance(max_lengths, Tensor) else type(max_lengths).__name__
        raise ValueError(f"max_lengths must be a tensor of long token counts, got {kind}")
    if max_lengths.shape != (batch_size,):
        shape = tuple(max_lengths.shape)
        raise ValueError(f"max_lengths must have shape ({batch_size},), got {shape}")


def first_argmax(logits: Tensor, block: int = 64) -> Tensor:
    """`logits.argmax(dim=-1)` (N,) long, NaN rows included; faster on a CPU, where `argmax` is
    much slower than `amax`: it looks only at the blocks' maxima and inside the best block."""
    rows, vocab_size = logits.shape
    whole = vocab_size // block * block
    if logits.device.type != "cpu" or whole < 16 * block:
        return logits.argmax(dim=-1)  # (N,)
    maxima = logits[:, :whole].reshape(rows, whole // block, block).amax(dim=-1)  # (N, V // block)
    columns = block_columns(logits, maxima.argmax(dim=-1, keepdim=True), block)  # (N, C)
    inside = logits.gather(1, columns).argmax(dim=-1, keepdim=True)  # (N, 1) the first best
    return columns.gather(1, inside).squeeze(1)  # (N,)


def block_columns(values: Tensor, blocks: Tensor, block: int) -> Tensor:
    """values (R, L), blocks (R, k) long, indices of `block`-wide blocks -> the columns
    (R, C), in order, of those blocks and of the tail that fills no block."""
    rows, length = values.shape
    offsets = torch.arange(block, device=values.device)  # (block,)
    columns = (blocks[:, :, None] * block + offsets).flatten(1)  # (R, k * block)
    tail = torch.arange(length // block * block, length, device=values.device)  # (L % block,)
    return torch.cat([columns, tail.expand(rows, -1)], dim=1)  # (R, C)


def _decode_paths(
    decoder: IncrementalDecoder,
    batch_size: int,
    max_lengths: Tensor,
    next_tokens: Callable[[Tensor, Tensor], Tensor],
) -> list[list[int]]:
    """Run one path per sentence; `next_tokens` steps `decoder` with the last tokens (N,) and
    picks the next (N,), given each row's sentence (N,)."""
    check_lengths(batch_size, max_lengths)
    device = max_lengths.device
    longest = max(int(max_lengths.max()), 0) if batch_size > 0 else 0
    # Each sentence's tokens, then EOS to the end: its length is where its first EOS lies.
    generated = torch.full((batch_size, longest + 1), EOS_ID, dtype=torch.long, device=device)
    sentences = torch.arange(batch_size, device=device)  # (N,) sentence of each decoder row
    tokens = torch.full((batch_size,), BOS_ID, dtype=torch.long, device=device)  # (N,)
    budgets, step = max_lengths, 0  # (N,) each row's
    finished = budgets <= 0  # (N,) nothing to decode at all
    while True:
        if bool(finished.any()):  # those rows leave the batch
            kept = rows_to_keep(~finished)  # (N',)
            sentences, tokens, budgets = sentences[kept], tokens[kept], budgets[kept]  # (N',)
            if sentences.numel() > 0:
                decoder.select(kept)
        if sentences.numel() == 0:
            break
        tokens = next_tokens(tokens, sentences)  # (N,)
        generated[sentences, step] = tokens  # (N,)
        step += 1
        finished = (tokens == EOS_ID) | (budgets <= step)  # (N,)

    lengths = (generated == EOS_ID).byte().argmax(dim=1)  # (B,) the first EOS of each
    return [row[:length] for row, length in zip(generated.tolist(), lengths.tolist(), strict=True)]
