"""Batches respect the token budget, cover every example once, and collate to the right tensors."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from qkv.data.batching import (
    PairBatch,
    collate_pairs,
    collate_texts,
    pad_to_bucket,
    pair_lengths,
    target_rows,
    token_budget_arrays,
    token_budget_batches,
    truncate,
)
from qkv.data.special import BOS_ID, CLS_ID, EOS_ID, PAD_ID


def random_lengths(n: int = 2000, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(1, 80) for _ in range(n)]


def padding_fraction(lengths: list[int], batches: list[list[int]]) -> float:
    padded = sum(len(batch) * max(lengths[i] for i in batch) for batch in batches)
    return 1 - sum(lengths) / padded


@pytest.mark.parametrize("shuffle", [True, False])
def test_budget_and_coverage(shuffle: bool) -> None:
    lengths = [*random_lengths(), 500, 1000]  # two examples longer than the budget
    batches = token_budget_batches(lengths, 400, shuffle=shuffle, seed=3, epoch=1)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        assert batch
        assert len(batch) * max(lengths[i] for i in batch) <= 400 or len(batch) == 1
    assert [len(lengths) - 2] in batches and [len(lengths) - 1] in batches


def test_batches_are_full() -> None:
    lengths = [10] * 95
    batches = token_budget_batches(lengths, 100, shuffle=False, seed=0, epoch=0)
    assert [len(batch) for batch in batches] == [10] * 9 + [5]


def test_bucketing_pads_less_than_random_order() -> None:
    lengths = random_lengths()
    bucketed = token_budget_batches(lengths, 800, shuffle=True, seed=0, epoch=0)
    order = list(range(len(lengths)))
    random.Random(0).shuffle(order)
    random_batches = [order[i : i + 20] for i in range(0, len(order), 20)]
    assert padding_fraction(lengths, bucketed) < 0.1
    assert padding_fraction(lengths, bucketed) < padding_fraction(lengths, random_batches) / 3


def test_deterministic_per_seed_and_epoch() -> None:
    lengths = random_lengths()

    def batches(seed: int, epoch: int) -> list[list[int]]:
        return token_budget_batches(lengths, 500, shuffle=True, seed=seed, epoch=epoch)

    assert batches(1, 2) == batches(1, 2)
    assert batches(1, 2) != batches(1, 3)
    assert batches(1, 2) != batches(2, 2)
    first, second = batches(1, 2), batches(1, 3)
    assert {tuple(sorted(b)) for b in first} != {tuple(sorted(b)) for b in second}


def test_without_shuffle_sorted_by_length() -> None:
    lengths = random_lengths(300)
    batches = token_budget_batches(lengths, 300, shuffle=False, seed=0, epoch=0)
    flat = [lengths[i] for batch in batches for i in batch]
    assert flat == sorted(lengths)
    assert batches == token_budget_batches(lengths, 300, shuffle=False, seed=9, epoch=4)


def test_empty_lengths_and_bad_arguments() -> None:
    assert token_budget_batches([], 100, shuffle=True, seed=0, epoch=0) == []
    with pytest.raises(ValueError):
        token_budget_batches([1], 0, shuffle=False, seed=0, epoch=0)


def test_pair_lengths() -> None:
    assert pair_lengths([[1, 2, 3], [1]], [[1], [1, 2, 3, 4]]) == [4, 5]


def test_collate_pairs_values() -> None:
    batch = collate_pairs([[5, 6, 7], [8]], [[9], [10, 11, 12]])
    assert isinstance(batch, PairBatch)
    assert batch.src.tolist() == [[5, 6, 7], [8, PAD_ID, PAD_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 9, PAD_ID, PAD_ID], [BOS_ID, 10, 11, 12]]
    assert batch.labels.tolist() == [[9, EOS_ID, PAD_ID, PAD_ID], [10, 11, 12, EOS_ID]]
    assert batch.src.dtype == batch.tgt_in.dtype == batch.labels.dtype == torch.long
    assert batch.n_target_tokens == 2 + 4


def test_collate_pairs_shapes_random() -> None:
    rng = random.Random(1)
    src = [[rng.randint(5, 99) for _ in range(rng.randint(1, 12))] for _ in range(16)]
    tgt = [[rng.randint(5, 99) for _ in range(rng.randint(0, 9))] for _ in range(16)]
    batch = collate_pairs(src, tgt)
    assert batch.src.shape == (16, max(map(len, src)))
    assert batch.tgt_in.shape == batch.labels.shape == (16, max(map(len, tgt)) + 1)
    for row, (s, t) in enumerate(zip(src, tgt, strict=True)):
        assert batch.src[row, : len(s)].tolist() == s
        assert batch.tgt_in[row, 1 : len(t) + 1].tolist() == t
        assert batch.labels[row, : len(t)].tolist() == t
        assert (batch.labels[row, len(t) + 1 :] == PAD_ID).all()
    # Teacher forcing: the decoder input is the labels shifted right by one.
    filled = batch.tgt_in[:, 1:] != PAD_ID
    assert torch.equal(batch.tgt_in[:, 1:][filled], batch.labels[:, :-1][filled])
    assert batch.n_target_tokens == sum(len(t) + 1 for t in tgt)


def test_collate_pairs_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="empty batch"):
        collate_pairs([], [])
    with pytest.raises(ValueError, match="sources"):
        collate_pairs([[5]], [])
    with pytest.raises(ValueError, match="source sequence 1"):
        collate_pairs([[5], []], [[6], [7]])


def test_collate_texts() -> None:
    batch = collate_texts([[5, 6], [7]], [1, 0])
    assert batch.ids.tolist() == [[5, 6], [7, PAD_ID]]
    assert batch.labels.tolist() == [1, 0]
    assert batch.labels.dtype == torch.long
    with_cls = collate_texts([[5, 6], [7]], [1, 0], cls=True)
    assert with_cls.ids.tolist() == [[CLS_ID, 5, 6], [CLS_ID, 7, PAD_ID]]


def test_batch_to_device_keeps_values() -> None:
    batch = collate_pairs([[5, 6]], [[7]])
    moved = batch.to("cpu")
    assert torch.equal(moved.src, batch.src) and torch.equal(moved.labels, batch.labels)


@pytest.mark.parametrize(
    ("max_len", "head_tail", "expected"),
    [
        (4, False, [0, 1, 2, 3]),
        (4, True, [0, 7, 8, 9]),
        (8, True, [0, 1, 4, 5, 6, 7, 8, 9]),
        (1, True, [9]),
        (20, True, list(range(10))),
    ],
)
def test_truncate(max_len: int, head_tail: bool, expected: list[int]) -> None:
    ids = list(range(10))
    assert truncate(ids, max_len, head_tail=head_tail) == expected
    assert ids == list(range(10))


def test_pad_to_bucket_rounds_shapes_up_and_adds_rows_without_targets() -> None:
    batch = collate_pairs([[5, 6, 7], [8]] * 9, [[9, 10], [11, 12, 13, 14, 15, 16, 17, 18, 19]] * 9)
    assert batch.src.shape == (18, 3) and batch.labels.shape == (18, 10)
    padded = pad_to_bucket(batch, rows=16, length=8)
    assert padded.src.shape == (32, 8)
    assert padded.tgt_in.shape == padded.labels.shape == (32, 16)
    assert torch.equal(padded.src[:18, :3], batch.src) and (padded.src[:18, 3:] == PAD_ID).all()
    assert torch.equal(padded.labels[:18, :10], batch.labels)
    assert torch.equal(padded.tgt_in[:18, :10], batch.tgt_in)
    assert (padded.labels[18:] == PAD_ID).all()  # the added rows have nothing to predict
    assert (padded.src[18:, 0] == EOS_ID).all() and (padded.src[18:, 1:] == PAD_ID).all()
    assert (padded.tgt_in[18:, 0] == BOS_ID).all() and (padded.tgt_in[18:, 1:] == PAD_ID).all()
    assert padded.n_target_tokens == batch.n_target_tokens
    same = pad_to_bucket(padded, rows=16, length=8)  # already at a bucket shape
    assert torch.equal(same.src, padded.src) and torch.equal(same.labels, padded.labels)


def test_target_rows_list_every_real_target_once_then_filler() -> None:
    labels = torch.tensor([[7, 8, EOS_ID, PAD_ID], [9, EOS_ID, PAD_ID, PAD_ID], [PAD_ID] * 4])
    rows, row_labels = target_rows(labels, multiple=4)
    assert rows.tolist() == [0, 1, 2, 4, 5, 0, 0, 0]
    assert row_labels.tolist() == [7, 8, EOS_ID, 9, EOS_ID, PAD_ID, PAD_ID, PAD_ID]
    assert torch.equal(labels.reshape(-1)[rows[:5]], row_labels[:5])
    rows, row_labels = target_rows(torch.full((2, 3), PAD_ID), multiple=4)
    assert rows.numel() == 4 and (row_labels == PAD_ID).all()


def test_index_arrays_are_the_batches_in_a_few_bytes_an_example() -> None:
    lengths = random_lengths()
    arrays = token_budget_arrays(np.array(lengths, np.int32), 500, shuffle=True, seed=1, epoch=2)
    assert all(batch.dtype == np.int32 for batch in arrays)
    lists = token_budget_batches(lengths, 500, shuffle=True, seed=1, epoch=2)
    assert [batch.tolist() for batch in arrays] == lists
