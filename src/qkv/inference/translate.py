"""Batched translation of token ids: sort by length, decode under a token budget, restore order."""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass

import torch
from tqdm import tqdm

from qkv.data.batching import token_budget_batches
from qkv.data.special import PAD_ID
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


@dataclass
class DecodeOptions:
    """How to decode. Output length is capped at max_len_a * |source| + max_len_b tokens."""

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


def translate_ids(
    model: Seq2SeqTransformer,
    sources: list[list[int]],
    options: DecodeOptions,
    device: torch.device,
    progress: bool = False,
) -> list[list[int]]:
    """Translate token-id sequences into target ids (no BOS/EOS either), in input order; a
    sampled sentence's stream is seeded from `options.seed` and its place in `sources` only.

    Raises ValueError for a token id outside the vocabulary, ConfigError for workers > 1 where
    workers cannot decode.
    """
    check_workers(options.workers, device)
    # Checked on the host: on a GPU an id out of range would leave the CUDA context unusable.
    for number, sentence in enumerate(sources):
        for token in sentence:
            if not 0 <= token < model.config.vocab_size:
                raise ValueError(
                    f"sources[{number}] holds token id {token}, outside the vocabulary "
                    f"[0, {model.config.vocab_size})"
                )
    was_training = model.training
    try:
        decoding = decoding_model(model.eval(), options.bf16, device)
        out: list[list[int]] = [[] for _ in sources]
        todo = [i for i, s in enumerate(sources) if s]
        lengths = [len(sources[i]) for i in todo]
        budget = max(options.max_tokens // options.beam_size, 1)
        batches = [
            [todo[i] for i in batch]
            for batch in token_budget_batches(lengths, budget, shuffle=False, seed=0, epoch=0)
        ]
        weights = DecodingWeights(decoding)  # made at the first batch, shared by the workers
        seeds = torch.randint(
            2**62, (len(sources),), generator=torch.Generator().manual_seed(options.seed)
        ).tolist()  # one per sentence

        def decode(index: int) -> list[list[int]]:
            rows = batches[index]
            width = max(len(sources[r]) for r in rows)
            src = torch.full((len(rows), width), PAD_ID, dtype=torch.long)  # (B, S)
            for j, r in enumerate(rows):
                src[j, : len(sources[r])] = torch.tensor(sources[r])
            row_seeds = [seeds[r] for r in rows]
            return _decode_batch(decoding, src.to(device), options, row_seeds, weights)

        width = 1 if options.sampling else options.beam_size
        workers = auto_workers(options.workers, device, width)
        found_batches = map_in_workers(decode, len(batches), workers)
        disable = None if progress else True
        with tqdm(total=len(todo), unit="sent", disable=disable, leave=False) as bar:
            for rows, found in zip(batches, found_batches, strict=True):
                for r, tokens in zip(rows, found, strict=True):
                    out[r] = tokens
                bar.update(len(rows))
        return out
    finally:
        model.train(was_training)


@torch.no_grad()
def _decode_batch(
    model: Seq2SeqTransformer,
    src: torch.Tensor,
    options: DecodeOptions,
    seeds: list[int],
    weights: DecodingWeights,
) -> list[list[int]]:
    """Sources (B, S), padded, on the model's device -> B lists of target ids; `seeds`: one per
    sentence, for sampling."""
    batch = src.size(0)
    src_lengths = (src != PAD_ID).sum(1)  # (B,)
    limit = model.config.max_len - 1
    # Terms cut to the limit first: a Python int such as 10**30 fits in no tensor.
    budgets = src_lengths * min(options.max_len_a, limit) + min(options.max_len_b, limit)
    max_lengths = budgets.clamp(0, limit).long()  # (B,)
    beams = 1 if options.sampling else options.beam_size
    decoder = make_decoder(
        model, src, int(max_lengths.max()) + 1, batch * beams, options.cuda_graphs, weights
    )
    if options.sampling:
        o = options
        return sample(decoder, batch, max_lengths, o.temperature, o.top_k, o.top_p, seeds=seeds)
    if options.beam_size > 1:
        found = beam_search(decoder, batch, options.beam_size, max_lengths, options.alpha)
        return [hyps[0].tokens for hyps in found]
    return greedy_search(decoder, batch, max_lengths)
