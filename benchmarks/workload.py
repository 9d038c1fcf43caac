"""The benchmark's workload: model shapes and Multi30k-shaped synthetic data.

Every system trains on the same batches and decodes the same sources. Sentence lengths follow
Multi30k (normal(13, 4) tokens, clipped to [3, 40]); a sentence is random word ids ended by EOS.
Ids 0..3 are special (pad, bos, eos, unk), as in `qkv.data.special`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

PAD, BOS, EOS = 0, 1, 2
FIRST_WORD = 4


@dataclass(frozen=True)
class Shape:
    """Model size shared by every system."""

    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024
    n_encoder_layers: int = 3
    n_decoder_layers: int = 3
    dropout: float = 0.1
    src_vocab: int = 8000
    tgt_vocab: int = 8000
    max_positions: int = 256


SHAPES = {
    "base": Shape(),
    # for the smoke tests: seconds, not minutes
    "tiny": Shape(
        d_model=32,
        n_heads=2,
        d_ff=64,
        n_encoder_layers=1,
        n_decoder_layers=1,
        src_vocab=100,
        tgt_vocab=100,
    ),
}


def draw_lengths(
    rng: np.random.RandomState,
    n: int,
    mean: float = 13.0,
    sd: float = 4.0,
    low: int = 3,
    high: int = 40,
) -> np.ndarray:
    """n sentence lengths (EOS included)."""
    return np.clip(np.rint(rng.normal(mean, sd, n)), low, high).astype(int)


def make_sentence(rng: np.random.RandomState, length: int, vocab: int) -> np.ndarray:
    """`length` tokens: length - 1 random word ids, then EOS."""
    sentence = rng.randint(FIRST_WORD, vocab, size=length)
    sentence[-1] = EOS
    return sentence.astype(np.int64)


def make_pairs(
    n_batches: int, tokens_per_batch: int, seed: int, shape: Shape
) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Groups of random (source, target) pairs in random order; pairs are added to a group
    until it holds at least `tokens_per_batch` target tokens."""
    rng = np.random.RandomState(seed)
    groups = []
    for _ in range(n_batches):
        pairs: list[tuple[np.ndarray, np.ndarray]] = []
        n_target = 0
        while n_target < tokens_per_batch:
            src_len, tgt_len = draw_lengths(rng, 2)
            pairs.append(
                (
                    make_sentence(rng, src_len, shape.src_vocab),
                    make_sentence(rng, tgt_len, shape.tgt_vocab),
                )
            )
            n_target += tgt_len
        groups.append(pairs)
    return groups


def pad_batch(sentences: list[np.ndarray]) -> np.ndarray:
    """Right-pad sentences into a (B, L) int64 array."""
    out = np.full((len(sentences), max(map(len, sentences))), PAD, np.int64)
    for row, sentence in enumerate(sentences):
        out[row, : len(sentence)] = sentence
    return out


def collate(pairs: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    """src (B, S); labels (B, T) = target with its EOS; tgt_in (B, T) = BOS + labels[:-1]."""
    labels = pad_batch([t for _, t in pairs])
    tgt_in = np.full_like(labels, PAD)
    tgt_in[:, 0] = BOS
    for row, (_, target) in enumerate(pairs):
        tgt_in[row, 1 : len(target)] = target[:-1]
    return {"src": pad_batch([s for s, _ in pairs]), "tgt_in": tgt_in, "labels": labels}


def make_train_batches(
    n_batches: int, tokens_per_batch: int, seed: int, shape: Shape
) -> list[dict[str, np.ndarray]]:
    """The identical batches every system trains on (random order, padded to the batch max)."""
    return [collate(pairs) for pairs in make_pairs(n_batches, tokens_per_batch, seed, shape)]


def make_sources(n: int, seed: int, shape: Shape) -> list[np.ndarray]:
    """Source sentences to translate."""
    rng = np.random.RandomState(seed)
    return [make_sentence(rng, length, shape.src_vocab) for length in draw_lengths(rng, n)]


def padding(batches: list[dict[str, np.ndarray]]) -> dict[str, float | int]:
    """Real and padded token counts of the batches' sources and targets (labels), and the
    padded share of each: padding tokens / all tokens."""
    out: dict[str, float | int] = {"batches": len(batches)}
    for side, key in (("src", "src"), ("tgt", "labels")):
        total = sum(int(b[key].size) for b in batches)
        real = sum(int((b[key] != PAD).sum()) for b in batches)
        out[f"{side}_tokens"], out[f"{side}_padded_tokens"] = real, total
        out[f"{side}_pad_share"] = (total - real) / total if total else 0.0
    return out


def digest(batches: list[dict[str, np.ndarray]]) -> str:
    """A short hash of the batches' contents and shapes: equal digests, identical batches."""
    h = hashlib.sha256()
    for batch in batches:
        for key in sorted(batch):
            array = np.ascontiguousarray(batch[key], dtype=np.int64)
            h.update(f"{key}{array.shape}".encode())
            h.update(array.tobytes())
    return h.hexdigest()[:16]
