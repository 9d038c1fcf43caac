"""Padded batches of token ids, grouped by length under a token budget.

Shapes: `B` batch, `S` source length, `T` target length, as in `qkv.model`. Padding is
`PAD_ID`, from which `qkv.model.masks` derives the padding mask.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, fields
from itertools import chain
from typing import TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from qkv.data.special import BOS_ID, CLS_ID, EOS_ID, PAD_ID

SHUFFLE_SEED_STRIDE = 100003  # prime: distinct (seed, epoch) pairs give distinct RNG seeds
_B = TypeVar("_B", bound="_Batch")
Row = Sequence[int] | np.ndarray  # one sequence of token ids: a list, or an int array (L,)


@dataclass(frozen=True)
class _Batch:
    def to(self: _B, device: torch.device | str) -> _B:
        """The same batch on `device`."""
        moved = {f.name: getattr(self, f.name).to(device) for f in fields(self)}
        return type(self)(**moved)


@dataclass(frozen=True)
class PairBatch(_Batch):
    """A batch of translation pairs."""

    src: torch.Tensor  # (B, S) source ids
    tgt_in: torch.Tensor  # (B, T) decoder input: BOS, then the target
    labels: torch.Tensor  # (B, T) what the decoder must predict: the target, then EOS

    @property
    def n_target_tokens(self) -> int:
        """Number of non-pad labels, the denominator of a per-token loss."""
        return int((self.labels != PAD_ID).sum())


@dataclass(frozen=True)
class TextBatch(_Batch):
    """A batch of texts to classify."""

    ids: torch.Tensor  # (B, S) token ids, CLS first when the model pools on it
    labels: torch.Tensor  # (B,) class indices


def collate_pairs(src: Sequence[Row], tgt: Sequence[Row]) -> PairBatch:
    """Pads B non-empty sources and B targets (no special tokens) into a `PairBatch` whose
    `tgt_in` is `[BOS] + tgt` and whose `labels` are `tgt + [EOS]`."""
    if len(src) != len(tgt):
        raise ValueError(f"{len(src)} sources but {len(tgt)} targets")
    if not src:
        raise ValueError("cannot collate an empty batch")
    empty = next((row for row, ids in enumerate(src) if len(ids) == 0), None)
    if empty is not None:
        raise ValueError(f"source sequence {empty} of the batch is empty")
    return PairBatch(
        src=torch.from_numpy(pad_rows(src)),  # (B, S)
        tgt_in=torch.from_numpy(pad_rows(tgt, first=BOS_ID)),  # (B, T)
        labels=torch.from_numpy(pad_rows(tgt, last=EOS_ID)),  # (B, T)
    )


def pad_to_bucket(batch: PairBatch, rows: int = 16, length: int = 8) -> PairBatch:
    """The batch padded to a coarser shape, on its device: src (B', S'), tgt_in, labels (B', T')
    with B, S, T rounded up to multiples of `rows` and `length`, so that a few CUDA graphs serve
    every batch. Added rows have all-PAD labels and hold EOS in the source and BOS in the
    decoder input, so that their attention has a key and stays finite."""
    batch_size, src_len = batch.src.shape
    size = round_up(batch_size, rows)
    src = pad_ids(batch.src, size, round_up(src_len, length))  # (B', S')
    tgt_in = pad_ids(batch.tgt_in, size, round_up(batch.labels.size(1), length))  # (B', T')
    labels = pad_ids(batch.labels, size, tgt_in.size(1))  # (B', T')
    src[batch_size:, 0] = EOS_ID
    tgt_in[batch_size:, 0] = BOS_ID
    return PairBatch(src=src, tgt_in=tgt_in, labels=labels)


def target_rows(labels: torch.Tensor, multiple: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """The flat positions b * T + t of the real targets of CPU labels (B, T), and their labels:
    rows (K,) and labels (K,), K rounded up to a multiple of `multiple` with 0 and PAD. The
    host counts the targets, which a CUDA-graph step could not without a read-back."""
    flat = labels.reshape(-1)  # (B * T,)
    real = (flat != PAD_ID).nonzero().squeeze(1)  # (M,)
    filler = max(round_up(real.numel(), multiple), multiple) - real.numel()  # K - M
    return F.pad(real, (0, filler)), F.pad(flat[real].long(), (0, filler), value=PAD_ID)


def bucket_inputs(batch: PairBatch) -> dict[str, torch.Tensor]:
    """A CPU batch as a CUDA-graph training step's inputs: src (B', S'), tgt_in (B', T'),
    rows (K,) and labels (K,) from `pad_to_bucket` and `target_rows`."""
    padded = pad_to_bucket(batch)
    rows, labels = target_rows(padded.labels)  # (K,) each
    return {"src": padded.src, "tgt_in": padded.tgt_in, "rows": rows, "labels": labels}


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def pad_ids(ids: torch.Tensor, batch_size: int, length: int) -> torch.Tensor:
    """ids (B, L) -> (batch_size, length), PAD after each row and in the rows added."""
    return F.pad(ids, (0, length - ids.size(1), 0, batch_size - ids.size(0)), value=PAD_ID)


def collate_texts(ids: Sequence[Row], labels: Sequence[int], cls: bool = False) -> TextBatch:
    """Pads B texts (no special tokens, CLS put first with `cls`) and their B class indices
    into a `TextBatch`."""
    if len(ids) != len(labels):
        raise ValueError(f"{len(ids)} texts but {len(labels)} labels")
    if not ids:
        raise ValueError("cannot collate an empty batch")
    padded = pad_rows(ids, first=CLS_ID if cls else None)
    if padded.shape[1] == 0:  # every text empty and no CLS: keep one pad column
        padded = np.full((len(ids), 1), PAD_ID, dtype=np.int64)
    return TextBatch(
        ids=torch.from_numpy(padded),  # (B, S)
        labels=torch.tensor(list(labels), dtype=torch.long),  # (B,)
    )


def pair_lengths(src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]]) -> list[int]:
    """Length of each pair for `token_budget_batches`: the longer side plus BOS or EOS."""
    return [max(len(s), len(t)) + 1 for s, t in zip(src, tgt, strict=True)]


def token_budget_batches(
    lengths: Sequence[int] | np.ndarray, max_tokens: int, *, shuffle: bool, seed: int, epoch: int
) -> list[list[int]]:
    """Groups the indices of `lengths` (padded) into batches of similar length such that
    `len(batch) * max(lengths in batch) <= max_tokens`, or of one example over the budget.
    With `shuffle` (training), ties in length and the batch order are random, drawn from
    (seed, epoch) alone; without it (evaluation), batches follow length order."""
    arrays = token_budget_arrays(lengths, max_tokens, shuffle=shuffle, seed=seed, epoch=epoch)
    return [batch.tolist() for batch in arrays]


def token_budget_arrays(
    lengths: Sequence[int] | np.ndarray, max_tokens: int, *, shuffle: bool, seed: int, epoch: int
) -> list[np.ndarray]:
    """`token_budget_batches` as arrays of indices, views of one int32 array: for a corpus of
    millions of examples, a few bytes per example instead of a Python int each."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    rng = random.Random(seed * SHUFFLE_SEED_STRIDE + epoch)
    sizes = np.asarray(lengths).reshape(-1)
    if sizes.dtype.kind not in "iu":
        sizes = sizes.astype(np.int64)
    if shuffle:
        tie_breaks = np.random.default_rng(rng.getrandbits(64)).random(len(sizes))
        order = np.lexsort((tie_breaks, sizes))  # by length, then by random key
        del tie_breaks
    else:
        order = np.argsort(sizes, kind="stable")
    order = order.astype(np.int32 if len(order) < 2**31 else np.int64)
    batches = _cut(sizes[order], order, max_tokens)
    if shuffle:
        rng.shuffle(batches)
    return batches


def truncate(ids: list[int], max_len: int, head_tail: bool = False) -> list[int]:
    """A new list of at most `max_len` (>= 1) of `ids`; `head_tail` keeps the first quarter
    and the last three quarters, found best on long reviews by Sun et al. (2019)."""
    if max_len < 1:
        raise ValueError(f"max_len must be at least 1, got {max_len}")
    if len(ids) <= max_len:
        return list(ids)
    if not head_tail:
        return ids[:max_len]
    head = max_len // 4
    return ids[:head] + ids[len(ids) - (max_len - head) :]


def _cut(sorted_lengths: np.ndarray, indices: np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """Greedy cut of length-sorted examples: each batch as long as the budget allows."""
    batches: list[np.ndarray] = []
    start = 0
    while start < len(indices):
        cap = max(max_tokens // max(int(sorted_lengths[start]), 1), 1)
        window = sorted_lengths[start : start + cap]
        # size * window[size - 1] grows with size: the sizes in budget come first.
        fits = np.count_nonzero(np.arange(1, len(window) + 1) * window <= max_tokens)
        size = max(int(fits), 1)  # one example over the budget makes a batch of its own
        batches.append(indices[start : start + size])
        start += size
    return batches


def pad_rows(rows: Sequence[Row], first: int | None = None, last: int | None = None) -> np.ndarray:
    """Rows framed by `first` and `last` (if given), right-padded with PAD: an int64 array."""
    offset = int(first is not None)
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    width = int(lengths.max(initial=0)) + offset + int(last is not None)
    padded = np.full((len(rows), width), PAD_ID, dtype=np.int64)
    columns = np.arange(width)
    filled = (columns >= offset) & (columns < lengths[:, None] + offset)  # (rows, width)
    total = int(lengths.sum())
    if rows and isinstance(rows[0], np.ndarray):
        padded[filled] = np.concatenate(rows)
    else:
        padded[filled] = np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=total)
    if first is not None:
        padded[:, 0] = first
    if last is not None:
        padded[np.arange(len(rows)), lengths + offset] = last
    return padded
