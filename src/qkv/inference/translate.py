"""Batched translation of token ids: sort by length, decode under a token budget, restore order."""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from qkv.data.batching import pad_rows, token_budget_batches
from qkv.data.special import BOS_ID, EOS_ID, PAD_ID
from qkv.errors import ConfigError
from qkv.fits import fits, type_name
from qkv.inference.beam import beam_search
from qkv.inference.graphed import make_decoder
from qkv.inference.incremental import DecodingWeights
from qkv.inference.precision import decoding_model
from qkv.inference.search import check_sampling, greedy_search, sample
from qkv.inference.workers import auto_workers, check_workers, map_in_workers
from qkv.model.seq2seq import Seq2SeqTransformer

MAX_BEAM = 256  # the widest beam: its memory grows with the square of the width
MAX_ALPHA = 10.0  # the largest length penalty exponent: ((5 + n) / 6)^alpha overflows above
SEARCH_FIELDS = ("beam_size", "alpha")  # beam search's: refused with sampling
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "seed")  # refused without it


@dataclass
class DecodeOptions:
    """How to decode. Output length is capped at max_len_a * |source| + max_len_b tokens. The
    options of beam search and those of sampling are refused with the other (ConfigError)."""

    beam_size: int = 1  # 1 = greedy
    alpha: float = 0.6  # GNMT length penalty exponent (beam search)
    max_len_a: float = 1.5
    max_len_b: int = 10
    sampling: bool = False  # sample instead of searching
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    max_tokens: int = 6000  # source tokens x beam per batch
    cuda_graphs: bool = True  # on a GPU, replay each step of the model as one CUDA graph
    workers: int = 0  # on a CPU, threads decoding batches side by side (0: `auto_workers`)
    bf16: bool = False  # decode a bfloat16 copy of the model (see `precision.py`)

    def __post_init__(self) -> None:
        """Raise ConfigError for a setting of the wrong type or out of range."""
        for name, hint in typing.get_type_hints(DecodeOptions).items():
            value = getattr(self, name)
            if not fits(value, hint):
                raise ConfigError(
                    f"{name} must be {type_name(hint)}, got {value!r} ({type(value).__name__})"
                )
        if not 1 <= self.beam_size <= MAX_BEAM:
            raise ConfigError(f"beam size must be between 1 and {MAX_BEAM}, got {self.beam_size}")
        if not 0 <= self.alpha <= MAX_ALPHA:  # NaN fails too
            raise ConfigError(
                f"the length penalty exponent alpha must be between 0 and {MAX_ALPHA}, "
                f"got {self.alpha}"
            )
        if not (0 <= self.max_len_a < math.inf and self.max_len_b >= 0):  # NaN fails too
            raise ConfigError(
                "max_len_a and max_len_b must be >= 0 and finite, "
                f"got {self.max_len_a}, {self.max_len_b}"
            )
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.workers < 0:
            raise ConfigError(f"workers must be >= 0 (0: as many as pay), got {self.workers}")
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"seed must be between 0 and 2**63 - 1, got {self.seed}")
        check_sampling(self.temperature, self.top_k, self.top_p)
        fields = SEARCH_FIELDS if self.sampling else SAMPLING_FIELDS
        if changed := [name for name in fields if getattr(self, name) != _DEFAULTS[name]]:
            use = "beam search, which sampling=True replaces" if self.sampling else "sampling=True"
            raise ConfigError(f"{changed[0]} is for {use}")


_DEFAULTS = {name: getattr(DecodeOptions, name) for name in SEARCH_FIELDS + SAMPLING_FIELDS}


def check_n_best(n_best: int, options: DecodeOptions) -> None:
    """Raise ConfigError unless `n_best` is a count of hypotheses the search keeps: one when
    sampling, up to the beam size for beam search."""
    if not fits(n_best, int):
        raise ConfigError(f"n_best must be int, got {n_best!r} ({type(n_best).__name__})")
    if options.sampling and n_best != 1:
        raise ConfigError(f"n_best ({n_best}) needs beam search: sampling keeps one translation")
    if not 1 <= n_best <= options.beam_size:
        raise ConfigError(
            f"n_best ({n_best}) must be between 1 and the beam size ({options.beam_size})"
        )


Progress = bool | Callable[[int], object]
"""A bar of its own (True), none (False), or a function told how many sentences are done."""

Found = tuple[list[int], float]
"""A translation's target ids (no BOS/EOS) and its score: log-probability (EOS included) over
the GNMT length penalty for beam search, the log-probability for greedy and sampled outputs."""


def translate_ids(
    model: Seq2SeqTransformer,
    sources: list[list[int]],
    options: DecodeOptions,
    device: torch.device,
    progress: Progress = False,
) -> list[list[int]]:
    """The best translation of each source; see `translate_hypotheses`."""
    found = translate_hypotheses(model, sources, options, device, 1, progress, scored=False)
    return [hypotheses[0][0] for hypotheses in found]


def translate_hypotheses(
    model: Seq2SeqTransformer,
    sources: list[list[int]],
    options: DecodeOptions,
    device: torch.device,
    n_best: int = 1,
    progress: Progress = False,
    scored: bool = True,
    weights: DecodingWeights | None = None,
    start: int = 0,
) -> list[list[Found]]:
    """Translate token-id sequences into the `n_best` best target-id sequences (no BOS/EOS
    either) with their scores (NaN unless `scored`), in input order. `n_best` > 1 needs beam
    search at least that wide. A sampled sentence's stream is seeded from `options.seed` and
    its place in the input only: `start + ` its index in `sources`, so that an input
    translated in parts samples as it would whole. `weights`: the model's frozen decoding
    weights, kept by the caller from call to call (by default made for this call; not used
    with bf16). `progress`: True for a bar on stderr (where it is a terminal), or a function
    told the number of each batch's sentences as they are done.

    Raises ValueError for a token id outside the vocabulary, ConfigError for workers > 1 where
    workers cannot decode or `n_best` wider than the beam.
    """
    check_workers(options.workers, device)
    check_n_best(n_best, options)
    check_start(start)
    # Checked on the host: on a GPU an id out of range would leave the CUDA context unusable.
    vocab_size = model.config.vocab_size
    for number, sentence in enumerate(sources):
        if (token := next((t for t in sentence if not 0 <= t < vocab_size), None)) is not None:
            message = f"holds token id {token}, outside the vocabulary [0, {vocab_size})"
            raise ValueError(f"sources[{number}] {message}")
    was_training = model.training
    try:
        decoding = decoding_model(model.eval(), options.bf16, device)
        if weights is None or decoding is not model:  # a bf16 copy: weights of its own
            weights = DecodingWeights(decoding)  # made at the first batch, shared by the workers
        beams, width = options.beam_size, 1 if options.sampling else options.beam_size
        todo = [i for i, s in enumerate(sources) if s]
        lengths, budget = [len(sources[i]) for i in todo], max(options.max_tokens // beams, 1)
        batched = token_budget_batches(lengths, budget, shuffle=False, seed=0, epoch=0)
        batches = [[todo[i] for i in batch] for batch in batched]
        seeds = sentence_seeds(options.seed, start, len(sources))

        def decode(index: int) -> list[list[Found]]:
            rows = batches[index]
            src = torch.from_numpy(pad_rows([sources[r] for r in rows])).to(device)  # (B, S)
            row_seeds = [seeds[r] for r in rows]
            return _decode_batch(decoding, src, options, row_seeds, weights, n_best, scored)

        out: list[list[Found]] = [[([], 0.0)] for _ in sources]
        workers = auto_workers(options.workers, device, width)
        done = zip(batches, map_in_workers(decode, len(batches), workers), strict=True)
        disable = None if progress is True else True  # None: a bar where stderr is a terminal
        with tqdm(total=len(sources), unit="sent", disable=disable, leave=False) as bar:
            advance = progress if callable(progress) else bar.update
            advance(len(sources) - len(todo))  # the blank ones
            for rows, found in done:
                for r, hypotheses in zip(rows, found, strict=True):
                    out[r] = hypotheses
                advance(len(rows))
        return out
    finally:
        model.train(was_training)


def check_start(start: int) -> None:
    """Raise ConfigError unless `start`, the place of a part's first sentence in the whole
    input, is a count below 2**63."""
    if not (fits(start, int) and 0 <= start < 2**63):
        raise ConfigError(f"start must be an int between 0 and 2**63 - 1, got {start!r}")


def sentence_seeds(seed: int, start: int, count: int) -> list[int]:
    """The sampling seeds of sentences `start` to `start + count` of an input: numbers of 62
    bits drawn by a counter-based generator (Philox) keyed by `seed`, one counter a sentence,
    so that a sentence's seed hangs on `seed` and its place alone, in parts or whole, at the
    same cost anywhere in the input."""
    drawn = np.random.Philox(key=seed, counter=start).random_raw(4 * count)  # 4 a counter
    return (drawn[::4] >> np.uint64(2)).tolist()


def budgets(src_lengths: Tensor, options: DecodeOptions, max_len: int) -> Tensor:
    """Source lengths (B,) long -> each sentence's budget of generated tokens (B,) long, EOS
    included: max_len_a x its length + max_len_b, within a model of `max_len` positions. The
    one rule of every engine."""
    limit = max_len - 1
    # Terms cut to the limit first: a Python int such as 10**30 fits in no tensor.
    found = src_lengths * min(options.max_len_a, limit) + min(options.max_len_b, limit)
    return found.clamp(0, limit).long()


@torch.no_grad()
def _decode_batch(
    model: Seq2SeqTransformer,
    src: torch.Tensor,
    options: DecodeOptions,
    seeds: list[int],
    weights: DecodingWeights,
    n_best: int,
    scored: bool,
) -> list[list[Found]]:
    """Sources (B, S), padded, on the model's device -> B lists of hypotheses; `seeds`: one
    per sentence, for sampling."""
    batch, o = src.size(0), options
    max_lengths = budgets((src != PAD_ID).sum(1), options, model.config.max_len)  # (B,)
    width = 1 if o.sampling else o.beam_size
    steps = int(max_lengths.max()) + 1
    decoder = make_decoder(model, src, steps, batch * width, o.cuda_graphs, weights)
    if width > 1:
        hypotheses = beam_search(decoder, batch, width, max_lengths, o.alpha)
        return [[(h.tokens, h.score) for h in hyps[:n_best]] for hyps in hypotheses]
    if o.sampling:
        found = sample(decoder, batch, max_lengths, o.temperature, o.top_k, o.top_p, seeds=seeds)
    else:
        found = greedy_search(decoder, batch, max_lengths)
    if scored:
        return _scored(model, src, found, max_lengths.tolist())
    return [[(tokens, math.nan)] for tokens in found]


def _scored(
    model: Seq2SeqTransformer, src: Tensor, outputs: list[list[int]], max_lengths: list[int]
) -> list[list[Found]]:
    """Greedy or sampled outputs with their log-probability under the model (EOS included when
    the output ended before its budget), from one more pass over source and output."""
    golds = [
        [*out, EOS_ID] if len(out) < budget else out
        for out, budget in zip(outputs, max_lengths, strict=True)
    ]  # an empty one takes one padded position, as does its input
    gold = torch.from_numpy(pad_rows([g or [PAD_ID] for g in golds])).to(src.device)  # (B, T)
    tgt_in = pad_rows([[BOS_ID, *g[:-1]] if g else [PAD_ID] for g in golds])  # (B, T)
    logits = model(src, torch.from_numpy(tgt_in).to(src.device)).float()  # (B, T, V)
    picked = logits.log_softmax(-1).gather(-1, gold[..., None])[..., 0]  # (B, T)
    scores = picked.masked_fill(gold == PAD_ID, 0.0).sum(1).tolist()  # (B,)
    return [[(out, score)] for out, score in zip(outputs, scores, strict=True)]
