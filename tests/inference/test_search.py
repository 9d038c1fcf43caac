"""Search algorithms driven by scripted toy decoders with known next-token distributions."""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

from qkv.errors import ConfigError
from qkv.inference.beam import (
    Hypothesis,
    _parents_in_place,
    _shared_prefixes,
    beam_search,
    length_penalty,
    topk_by_blocks,
)
from qkv.inference.search import filter_logits, first_argmax, greedy_search, rows_to_keep, sample

PAD, BOS, EOS, TOK_A, TOK_B = range(5)  # toy vocabulary; BOS and EOS match qkv.data.special
VOCAB_SIZE = 5

NextLogProbs = Callable[[int, tuple[int, ...]], Tensor]
"""(sentence, tokens generated so far) -> next-token log-probabilities (V,)."""


class ToyDecoder:
    """An `IncrementalDecoder` that tracks each row's prefix and answers from a function of it."""

    def __init__(self, next_log_probs: NextLogProbs, sentences: list[int]) -> None:
        self.next_log_probs = next_log_probs
        self.sentences = list(sentences)  # which sentence each row decodes
        self.prefixes: list[tuple[int, ...]] = [() for _ in sentences]  # tokens fed, BOS first
        self.rows_fed: list[int] = []  # N at every step

    def step(self, tokens: Tensor) -> Tensor:
        assert tokens.dtype == torch.long
        assert tokens.shape == (len(self.prefixes),)
        self.prefixes = [(*p, t) for p, t in zip(self.prefixes, tokens.tolist(), strict=True)]
        assert all(p[0] == BOS for p in self.prefixes)
        self.rows_fed.append(len(self.prefixes))
        pairs = zip(self.sentences, self.prefixes, strict=True)
        return torch.stack([self.next_log_probs(s, p[1:]) for s, p in pairs])  # (N, V)

    def select(self, rows: Tensor, held: Tensor | None = None) -> None:
        assert rows.dtype == torch.long and rows.dim() == 1 and rows.numel() > 0
        if held is not None:  # the places' prefixes, BOS included, are those of the new rows
            for i, (row, count) in enumerate(zip(rows.tolist(), held.tolist(), strict=True)):
                assert self.sentences[i] == self.sentences[row] or count == 0
                assert self.prefixes[i][:count] == self.prefixes[row][:count]
        self.sentences = [self.sentences[r] for r in rows.tolist()]
        self.prefixes = [self.prefixes[r] for r in rows.tolist()]


def table_log_probs(table: dict[tuple[int, ...], dict[int, float]]) -> NextLogProbs:
    """Next-token distributions from a table keyed by prefix; uniform over EOS, a, b elsewhere."""

    def next_log_probs(sentence: int, prefix: tuple[int, ...]) -> Tensor:
        probs = torch.zeros(VOCAB_SIZE, dtype=torch.float64)
        for token, prob in table.get(prefix, {EOS: 1 / 3, TOK_A: 1 / 3, TOK_B: 1 / 3}).items():
            probs[token] = prob
        return probs.log()

    return next_log_probs


# Greedy takes a (0.5), a (0.6), EOS (0.7): p = 0.21. Beam search (W = 2) also finds b EOS,
# p = 0.3 * 0.8 = 0.24, which greedy misses; with alpha = 1 the longer "a a" wins again.
CLASSIC = table_log_probs(
    {
        (): {TOK_A: 0.5, TOK_B: 0.3, EOS: 0.2},
        (TOK_A,): {TOK_A: 0.6, EOS: 0.3, TOK_B: 0.1},
        (TOK_B,): {EOS: 0.8, TOK_A: 0.1, TOK_B: 0.1},
        (TOK_A, TOK_A): {EOS: 0.7, TOK_A: 0.2, TOK_B: 0.1},
        (TOK_A, TOK_B): {EOS: 0.5, TOK_A: 0.25, TOK_B: 0.25},
    }
)


def random_log_probs(seed: int, vocab_size: int = 8) -> NextLogProbs:
    """Log-probabilities that are a fixed pseudo-random function of (seed, sentence, prefix)."""

    def next_log_probs(sentence: int, prefix: tuple[int, ...]) -> Tensor:
        key = zlib.crc32(repr((seed, sentence, prefix)).encode())
        logits = torch.randn(vocab_size, generator=torch.Generator().manual_seed(key))
        logits[PAD] = logits[BOS] = -math.inf
        logits[EOS] -= 1.0  # long enough sentences that some reach their max length
        return logits.log_softmax(dim=-1)

    return next_log_probs


def lengths(*values: int) -> Tensor:
    return torch.tensor(values, dtype=torch.long)


def hyp(tokens: list[int], prob: float, steps: int, alpha: float) -> Hypothesis:
    log_prob = math.log(prob)
    return Hypothesis(tokens, log_prob / ((5 + steps) / 6) ** alpha, log_prob)


def assert_hypotheses(actual: list[Hypothesis], expected: list[Hypothesis]) -> None:
    assert [h.tokens for h in actual] == [h.tokens for h in expected]
    assert [h.score for h in actual] == pytest.approx([h.score for h in expected], abs=1e-9)
    assert [h.log_prob for h in actual] == pytest.approx([h.log_prob for h in expected], abs=1e-9)


# Greedy search


@pytest.mark.parametrize(
    ("max_length", "expected"),
    [(10, [TOK_A, TOK_A]), (3, [TOK_A, TOK_A]), (2, [TOK_A, TOK_A]), (1, [TOK_A]), (0, [])],
)
def test_greedy_stops_at_eos_or_max_length(max_length: int, expected: list[int]) -> None:
    decoder = ToyDecoder(CLASSIC, [0])
    assert greedy_search(decoder, 1, lengths(max_length)) == [expected]
    assert len(decoder.rows_fed) == min(max_length, 3)


@pytest.mark.parametrize("seed", range(20))
def test_rows_to_keep_moves_live_rows_only_into_the_places_of_finished_ones(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    live = torch.rand(int(torch.randint(1, 12, (1,), generator=generator)), generator=generator)
    live = live < 0.6  # (N,)
    rows = rows_to_keep(live)  # (N',)
    count = int(live.sum())
    assert sorted(rows.tolist()) == live.nonzero().squeeze(1).tolist()  # each live row once
    stayed = rows == torch.arange(count)  # (N',)
    assert bool(stayed[live[:count]].all())  # live rows among the first N' stay put
    assert int((~stayed).sum()) == int((~live[:count]).sum())  # one move per finished row


def test_greedy_drops_finished_rows() -> None:
    decoder = ToyDecoder(CLASSIC, [0, 1, 2, 3])
    result = greedy_search(decoder, 4, lengths(1, 5, 2, 0))
    assert result == [[TOK_A], [TOK_A, TOK_A], [TOK_A, TOK_A], []]
    assert decoder.rows_fed == [3, 2, 1]


@pytest.mark.parametrize("seed", range(6))
def test_batched_greedy_equals_one_sentence_at_a_time(seed: int) -> None:
    next_log_probs = random_log_probs(seed)
    budgets = [0, 1, 3, 6, 9, 12, 12]  # sentences end by EOS or by budget, at many steps
    batched = greedy_search(ToyDecoder(next_log_probs, list(range(7))), 7, lengths(*budgets))
    alone = [
        greedy_search(ToyDecoder(next_log_probs, [s]), 1, lengths(budget))[0]
        for s, budget in enumerate(budgets)
    ]
    assert batched == alone
    assert all(EOS not in t and len(t) <= b for t, b in zip(alone, budgets, strict=True))


# Beam search


def test_length_penalty() -> None:
    assert length_penalty(1, 0.0) == 1.0
    assert length_penalty(1, 1.0) == 1.0
    assert length_penalty(7, 0.5) == pytest.approx(math.sqrt(2.0))


def test_beam_finds_more_probable_sentence_than_greedy() -> None:
    assert greedy_search(ToyDecoder(CLASSIC, [0]), 1, lengths(10)) == [[TOK_A, TOK_A]]
    decoder = ToyDecoder(CLASSIC, [0])
    [result] = beam_search(decoder, 1, 2, lengths(10), alpha=0.0)
    # Step 2 finalises "b" (0.24, ranked 2nd of 2W); "a EOS" (0.15, ranked 3rd) is not
    # finalised. Step 3 finalises "a a" (0.21), the 2nd finished hypothesis: done.
    assert_hypotheses(result, [hyp([TOK_B], 0.24, 2, 0.0), hyp([TOK_A, TOK_A], 0.21, 3, 0.0)])
    assert decoder.rows_fed == [1, 2, 2]


def test_beam_length_penalty_reorders_hypotheses() -> None:
    [result] = beam_search(ToyDecoder(CLASSIC, [0]), 1, 2, lengths(10), alpha=1.0)
    # log(0.21) / (8 / 6) = -1.1705 beats log(0.24) / (7 / 6) = -1.2232.
    assert_hypotheses(result, [hyp([TOK_A, TOK_A], 0.21, 3, 1.0), hyp([TOK_B], 0.24, 2, 1.0)])


def test_beam_max_length_finalises_live_beams_without_eos() -> None:
    [result] = beam_search(ToyDecoder(CLASSIC, [0]), 1, 2, lengths(2), alpha=1.0)
    # Live at the limit: "a a" (0.30) and "a b" (0.05); finished: "b" (0.24). All 2 steps long.
    assert_hypotheses(result, [hyp([TOK_A, TOK_A], 0.30, 2, 1.0), hyp([TOK_B], 0.24, 2, 1.0)])
    [result] = beam_search(ToyDecoder(CLASSIC, [0]), 1, 2, lengths(1), alpha=0.0)
    # EOS (0.2) ranks 3rd after "a" and "b", so it is not finalised.
    assert_hypotheses(result, [hyp([TOK_A], 0.5, 1, 0.0), hyp([TOK_B], 0.3, 1, 0.0)])


def test_beam_keeps_the_best_when_more_than_w_finish_at_once() -> None:
    [result] = beam_search(ToyDecoder(CLASSIC, [0]), 1, 3, lengths(10), alpha=0.0)
    # W = 3 finalises EOS (0.2) at step 1, "b" (0.24) and "a" (0.15) at step 2.
    expected = [hyp([TOK_B], 0.24, 2, 0.0), hyp([], 0.2, 1, 0.0), hyp([TOK_A], 0.15, 2, 0.0)]
    assert_hypotheses(result, expected)


def test_beam_on_a_vocabulary_smaller_than_the_beam() -> None:
    [result] = beam_search(ToyDecoder(CLASSIC, [0]), 1, 4, lengths(1), alpha=0.0)
    # Only a, b and EOS are possible: two live beams at the limit, EOS finalised at rank 3.
    expected = [hyp([TOK_A], 0.5, 1, 0.0), hyp([TOK_B], 0.3, 1, 0.0), hyp([], 0.2, 1, 0.0)]
    assert_hypotheses(result, expected)


def test_beam_zero_max_length_gives_the_empty_hypothesis() -> None:
    decoder = ToyDecoder(CLASSIC, [0, 1])
    result = beam_search(decoder, 2, 2, lengths(0, 1), alpha=0.0)
    assert result[0] == [Hypothesis([], 0.0, 0.0)]
    assert [h.tokens for h in result[1]] == [[TOK_A], [TOK_B]]
    assert decoder.rows_fed == [1]


def test_beam_drops_finished_sentences() -> None:
    decoder = ToyDecoder(CLASSIC, [0, 1, 2])
    result = beam_search(decoder, 3, 2, lengths(1, 2, 10), alpha=0.0)
    # Step 1 on B rows, then W rows per live sentence: sentence 0 stops at 1, sentence 1 at 2.
    assert decoder.rows_fed == [3, 4, 2]
    assert [h.tokens for h in result[0]] == [[TOK_A], [TOK_B]]
    assert [h.tokens for h in result[1]] == [[TOK_A, TOK_A], [TOK_B]]
    assert [h.tokens for h in result[2]] == [[TOK_B], [TOK_A, TOK_A]]


@pytest.mark.parametrize("seed", range(6))
def test_beam_of_one_equals_greedy(seed: int) -> None:
    max_lengths = torch.randint(0, 15, (6,), generator=torch.Generator().manual_seed(seed))
    greedy = greedy_search(ToyDecoder(random_log_probs(seed), list(range(6))), 6, max_lengths)
    beams = beam_search(ToyDecoder(random_log_probs(seed), list(range(6))), 6, 1, max_lengths)
    assert [[h.tokens for h in hyps] for hyps in beams] == [[tokens] for tokens in greedy]


@pytest.mark.parametrize(("seed", "beam_size"), [(0, 2), (1, 3), (2, 4), (3, 5)])
def test_batched_beam_equals_one_sentence_at_a_time(seed: int, beam_size: int) -> None:
    max_lengths = lengths(3, 12, 1, 7, 20)
    batched = beam_search(
        ToyDecoder(random_log_probs(seed), list(range(5))), 5, beam_size, max_lengths
    )
    for sentence, hyps in enumerate(batched):
        decoder = ToyDecoder(random_log_probs(seed), [sentence])
        [alone] = beam_search(decoder, 1, beam_size, max_lengths[sentence : sentence + 1])
        assert_hypotheses(hyps, alone)
        assert 1 <= len(hyps) <= beam_size
        assert all(len(h.tokens) <= max_lengths[sentence] for h in hyps)
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


def test_beam_scores_are_normalised_log_probs() -> None:
    alpha = 0.6
    [hyps] = beam_search(ToyDecoder(random_log_probs(7), [0]), 1, 4, lengths(9), alpha=alpha)
    for h in hyps:
        steps = len(h.tokens) + 1 if len(h.tokens) < 9 else 9  # + 1 for EOS below the limit
        assert h.score == pytest.approx(h.log_prob / length_penalty(steps, alpha), rel=1e-6)


def test_beam_rejects_empty_beam() -> None:
    with pytest.raises(ConfigError):
        beam_search(ToyDecoder(CLASSIC, [0]), 1, 0, lengths(3))


# Sampling


def test_filter_logits_top_k_keeps_exactly_k() -> None:
    logits = torch.tensor([[0.1, 3.0, -1.0, 2.0, 0.5], [5.0, 4.0, 3.0, 2.0, 1.0]])
    filtered = filter_logits(logits, top_k=2)
    assert filtered.isfinite().tolist() == [
        [False, True, False, True, False],
        [True, True, False, False, False],
    ]
    assert torch.equal(filtered[filtered.isfinite()], logits[filtered.isfinite()])
    assert torch.equal(filter_logits(logits, top_k=0), logits)
    assert torch.equal(filter_logits(logits, top_k=9), logits)


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [(1.0, {0, 1, 2, 3}), (0.9, {1, 2, 3}), (0.75, {1, 3}), (0.45, {3}), (0.3, {3}), (0.01, {3})],
)
def test_filter_logits_top_p_keeps_smallest_set_reaching_p(top_p: float, kept: set[int]) -> None:
    probs = torch.tensor([[0.05, 0.3, 0.15, 0.5]])
    filtered = filter_logits(probs.log(), top_p=top_p)
    assert set(filtered[0].isfinite().nonzero().squeeze(1).tolist()) == kept


def test_filter_logits_applies_top_k_before_top_p() -> None:
    probs = torch.tensor([[0.05, 0.3, 0.15, 0.5]])
    # After top-2 the mass is renormalised to {0.5: 0.625, 0.3: 0.375}: p = 0.6 keeps one token.
    filtered = filter_logits(probs.log(), top_k=2, top_p=0.6)
    assert filtered[0].isfinite().tolist() == [False, False, False, True]


@pytest.mark.parametrize("seed", range(3))
def test_sample_with_top_k_one_equals_greedy(seed: int) -> None:
    max_lengths = torch.randint(0, 15, (6,), generator=torch.Generator().manual_seed(seed))
    greedy = greedy_search(ToyDecoder(random_log_probs(seed), list(range(6))), 6, max_lengths)
    sampled = sample(
        ToyDecoder(random_log_probs(seed), list(range(6))), 6, max_lengths, top_k=1, top_p=0.5
    )
    assert sampled == greedy


@pytest.mark.parametrize(
    "max_lengths", [torch.tensor([2.5, 3.0]), [3, 3], torch.tensor([3, 3], dtype=torch.int32)]
)
def test_budgets_must_be_a_long_tensor(max_lengths: object) -> None:
    for search in (greedy_search, sample):
        with pytest.raises(ValueError, match="max_lengths must be a tensor of long token counts"):
            search(ToyDecoder(CLASSIC, [0, 1]), 2, max_lengths)  # type: ignore[operator]
    with pytest.raises(ValueError, match="max_lengths must be a tensor of long token counts"):
        beam_search(ToyDecoder(CLASSIC, [0, 1]), 2, 2, max_lengths)  # type: ignore[arg-type]


@pytest.mark.parametrize("temperature", [1e-40, 1e-300])
def test_a_vanishing_temperature_samples_as_greedy_search_decodes(temperature: float) -> None:
    max_lengths = lengths(*[12] * 6)
    greedy = greedy_search(ToyDecoder(random_log_probs(1), list(range(6))), 6, max_lengths)
    decoder = ToyDecoder(random_log_probs(1), list(range(6)))
    assert sample(decoder, 6, max_lengths, temperature=temperature) == greedy


@pytest.mark.parametrize("temperature", [3.5e38, 1e300])
def test_a_temperature_beyond_the_dtype_draws_words_uniformly(temperature: float) -> None:
    def flat(sentence: int, prefix: tuple[int, ...]) -> Tensor:
        return torch.tensor([0.0, 0.0, -50.0, -1.0, -30.0])  # PAD, BOS, EOS, a, b

    generator = torch.Generator().manual_seed(0)
    decoder = ToyDecoder(flat, list(range(64)))
    found = sample(decoder, 64, lengths(*[4] * 64), temperature=temperature, generator=generator)
    tokens = [token for sentence in found for token in sentence]
    assert set(tokens) == {TOK_A, TOK_B}  # words only, however unlikely: no NaN, no PAD


def test_sample_never_draws_padding_or_bos() -> None:
    def mostly_padding(sentence: int, prefix: tuple[int, ...]) -> Tensor:
        return torch.tensor([0.0, -0.1, -3.0, -2.0, -2.0])  # PAD, BOS, EOS, a, b

    generator = torch.Generator().manual_seed(0)
    found = sample(
        ToyDecoder(mostly_padding, list(range(16))), 16, lengths(*[6] * 16), generator=generator
    )
    tokens = {token for sentence in found for token in sentence}
    assert tokens and tokens <= {TOK_A, TOK_B}


def test_sample_is_reproducible_with_a_seeded_generator() -> None:
    def run(seed: int) -> list[list[int]]:
        decoder = ToyDecoder(random_log_probs(0), list(range(8)))
        generator = torch.Generator().manual_seed(seed)
        return sample(decoder, 8, lengths(*[12] * 8), temperature=1.5, generator=generator)

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_a_sentences_sample_depends_on_its_seed_not_on_its_neighbours() -> None:
    """Sentences that end early drop out, so rows move; each sentence keeps its own stream."""
    seeds, budgets = [11, 12, 13, 14, 15, 16], [12, 3, 12, 0, 7, 12]
    together = sample(
        ToyDecoder(random_log_probs(0), list(range(6))), 6, lengths(*budgets), seeds=seeds
    )
    assert len({tuple(tokens) for tokens in together}) > 2  # the sentences do draw differently
    for sentence in range(6):
        alone = sample(
            ToyDecoder(random_log_probs(0), [sentence]),
            1,
            lengths(budgets[sentence]),
            seeds=[seeds[sentence]],
        )
        assert alone == [together[sentence]]


def test_sample_wants_one_seed_per_sentence() -> None:
    with pytest.raises(ValueError, match="2 seeds"):
        sample(ToyDecoder(CLASSIC, [0, 1]), 2, lengths(3, 3), seeds=[1])


@pytest.mark.parametrize(
    ("temperature", "top_p", "expected"),
    [
        (1.0, 1.0, {(TOK_A,): 0.5, (TOK_B,): 0.3, (): 0.2}),
        (0.5, 1.0, {(TOK_A,): 0.25 / 0.38, (TOK_B,): 0.09 / 0.38, (): 0.04 / 0.38}),
        (1.0, 0.6, {(TOK_A,): 0.625, (TOK_B,): 0.375, (): 0.0}),
    ],
)
def test_sample_draws_from_the_filtered_distribution(
    temperature: float, top_p: float, expected: dict[tuple[int, ...], float]
) -> None:
    count = 4000
    decoder = ToyDecoder(CLASSIC, list(range(count)))
    generator = torch.Generator().manual_seed(0)
    result = sample(decoder, count, lengths(*[1] * count), temperature, 0, top_p, generator)
    for tokens, prob in expected.items():
        frequency = sum(tuple(r) == tokens for r in result) / count
        assert frequency == pytest.approx(prob, abs=0.03)


@pytest.mark.parametrize(
    "kwargs", [{"temperature": 0.0}, {"top_k": -1}, {"top_p": 0.0}, {"top_p": 1.5}]
)
def test_sample_rejects_bad_settings(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        sample(ToyDecoder(CLASSIC, [0]), 1, lengths(3), **kwargs)


@pytest.mark.parametrize("seed", range(5))
def test_beams_are_arranged_so_each_parent_keeps_its_slot(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    parents = torch.randint(0, 4, (50, 4), generator=generator)  # (B', W)
    parents[0] = 0  # every beam from one parent
    parents[1] = torch.tensor([3, 2, 1, 0])  # a permutation: nobody moves
    order = _parents_in_place(parents)
    assert torch.equal(order.sort(dim=1).values, torch.arange(4).expand(50, 4))  # permutations
    arranged = parents.gather(1, order)  # (B', W) the parent of the beam in each slot
    for row, slots in zip(parents.tolist(), arranged.tolist(), strict=True):
        assert sorted(slots) == sorted(row)
        assert all(slots[p] == p for p in set(row))  # a child of p sits in slot p
    assert arranged[1].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("shape", [(64, 8000), (7, 64 * 20 + 5), (3, 17), (5, 1), (0, 2000)])
def test_argmax_equals_torch_argmax(shape: tuple[int, int]) -> None:
    logits = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    assert torch.equal(first_argmax(logits), logits.argmax(dim=-1))
    assert torch.equal(first_argmax(logits.t().contiguous().t()), logits.argmax(dim=-1))  # a view


def test_argmax_takes_the_first_maximum_and_treats_inf_and_nan_as_argmax_does() -> None:
    vocab = 64 * 20 + 3  # 20 whole chunks and a tail
    logits = torch.zeros(6, vocab)
    logits[0, [70, 700, vocab - 1]] = 5.0  # equal maxima in two chunks and the tail
    logits[1] = -math.inf
    logits[2, [100, vocab - 2]] = math.inf
    logits[3, 900] = math.nan
    logits[4, vocab - 2] = 9.0  # the tail alone holds the maximum
    assert (
        first_argmax(logits).tolist()
        == logits.argmax(dim=-1).tolist()
        == [70, 0, 100, 900, vocab - 2, 0]
    )


@pytest.mark.parametrize(
    ("rows", "length", "k"), [(64, 40000, 10), (5, 64 * 30 + 7, 10), (2, 300, 4), (3, 20, 6)]
)
def test_topk_by_blocks_equals_topk(rows: int, length: int, k: int) -> None:
    values = torch.randn(rows, length, generator=torch.Generator().manual_seed(length))
    values[0, : length // 2] = -math.inf  # a masked half, as EOS or missing beams give
    expected = values.topk(k, dim=1)
    top_values, top_index = topk_by_blocks(values, k)
    assert torch.equal(top_values, expected.values)
    assert torch.equal(top_index, expected.indices)


def test_shared_prefixes_counts_bos_and_the_tokens_a_place_shares_with_its_new_row() -> None:
    fed = torch.tensor([[[5, 6, 7], [5, 6, 8]], [[5, 9, 9], [4, 9, 9]]])  # (B' 2, w 2, T 3)
    rows = torch.tensor([1, 1, 3, 2])  # place 0 takes its sibling, place 1 stays, 2 and 3 swap
    assert _shared_prefixes(fed, rows).tolist() == [3, 4, 1, 1]
    rows = torch.tensor([2, 3])  # sentence 0 done: sentence 1's rows move up
    assert _shared_prefixes(fed, rows).tolist() == [0, 0]
    assert _shared_prefixes(fed, torch.tensor([0, 0, 1, 1, 2])) is None  # more rows


def test_topk_by_blocks_finds_values_in_one_block_and_in_the_tail() -> None:
    values = torch.zeros(1, 64 * 40 + 5)
    values[0, 64 * 7 : 64 * 7 + 6] = torch.arange(10.0, 16.0)  # six in one block
    values[0, -1] = 20.0  # the best in the tail that fills no block
    top_values, top_index = topk_by_blocks(values, 7)
    assert top_values.tolist() == [[20.0, 15.0, 14.0, 13.0, 12.0, 11.0, 10.0]]
    assert top_index.tolist() == [[64 * 40 + 4] + [64 * 7 + i for i in range(5, -1, -1)]]
