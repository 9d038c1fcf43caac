"""The searches whose steps stay on the device, run eagerly on the CPU: they find what the
host-driven searches find. (Their steps replayed as CUDA graphs: tests/test_cuda.py.)"""

from __future__ import annotations

import pytest
import torch

from qkv.errors import ConfigError
from qkv.inference.beam import Hypothesis, beam_search
from qkv.inference.graphed_search import graphed_beam_search, graphed_greedy_search
from qkv.inference.search import greedy_search
from qkv.model.seq2seq import Seq2SeqTransformer
from tests.inference.helpers import ReferenceDecoder, decoder, tokens_of
from tests.model.helpers import random_ids, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_LENGTHS = torch.tensor([5, 12, 3, 20, 1, 8, 0, 15])
"""Budgets from none at all to the decoder's whole length."""


@pytest.fixture(params=["post-norm", "pre-norm"])
def model(request: pytest.FixtureRequest) -> Seq2SeqTransformer:
    torch.manual_seed(0)
    config = tiny_config(vocab_size=60, max_len=40, norm_first=request.param == "pre-norm")
    return Seq2SeqTransformer(config).eval()


@pytest.fixture
def src() -> torch.Tensor:
    torch.manual_seed(1)
    ids = random_ids(8, 9, vocab=60)
    ids[1, 4:] = 0
    ids[3, 2:] = 0
    return ids  # (B, S)


@torch.inference_mode()
@pytest.mark.parametrize("beam_size", [1, 3, 5])
@pytest.mark.parametrize("eos_bias", [0.0, 2.5])
def test_beam_search_finds_what_the_host_driven_search_finds(
    model: Seq2SeqTransformer, src: torch.Tensor, beam_size: int, eos_bias: float
) -> None:
    rows = src.size(0) * beam_size
    expected = beam_search(decoder(model, src, 20, rows, eos_bias), 8, beam_size, MAX_LENGTHS)
    found = graphed_beam_search(decoder(model, src, 20, rows, eos_bias), 8, beam_size, MAX_LENGTHS)
    assert tokens_of(found) == tokens_of(expected)
    assert [[(h.score, h.log_prob) for h in hyps] for hyps in found] == [
        [(h.score, h.log_prob) for h in hyps] for hyps in expected
    ]
    if eos_bias == 0.0:
        reference = beam_search(ReferenceDecoder(model, src, 20), 8, beam_size, MAX_LENGTHS)
        assert tokens_of(found) == tokens_of(reference)


@torch.inference_mode()
def test_hypotheses_end_early_at_their_budget_and_with_none(
    model: Seq2SeqTransformer, src: torch.Tensor
) -> None:
    """What the case above with EOS likelier goes through: every way of finishing."""
    found = graphed_beam_search(decoder(model, src, 20, 24, 2.5), 8, 3, MAX_LENGTHS)
    budgets = MAX_LENGTHS.tolist()
    lengths = [
        (len(h.tokens), budget) for hyps, budget in zip(found, budgets, strict=True) for h in hyps
    ]
    assert found[6] == [Hypothesis([], 0.0, 0.0)]  # a budget of 0
    assert any(n < budget - 1 for n, budget in lengths)  # ended by EOS
    assert any(n == budget for n, budget in lengths)  # stopped at the budget
    assert all(len(hyps) == 3 for hyps, budget in zip(found, budgets, strict=True) if budget > 3)


@torch.inference_mode()
@pytest.mark.parametrize("eos_bias", [0.0, 2.5])
def test_greedy_search_finds_what_the_host_driven_search_finds(
    model: Seq2SeqTransformer, src: torch.Tensor, eos_bias: float
) -> None:
    expected = greedy_search(decoder(model, src, 20, 8, eos_bias), 8, MAX_LENGTHS)
    found = graphed_greedy_search(decoder(model, src, 20, 8, eos_bias), 8, MAX_LENGTHS)
    assert found == expected
    if eos_bias == 0.0:
        assert found == greedy_search(ReferenceDecoder(model, src, 20), 8, MAX_LENGTHS)
    else:  # some sentences ended before their budget
        assert any(len(t) < n for t, n in zip(found, MAX_LENGTHS.tolist(), strict=True))


@torch.inference_mode()
def test_a_batch_with_nothing_to_generate(model: Seq2SeqTransformer, src: torch.Tensor) -> None:
    nothing = torch.zeros(8, dtype=torch.long)
    assert graphed_greedy_search(decoder(model, src, 4, 8), 8, nothing) == [[]] * 8
    found = graphed_beam_search(decoder(model, src, 4, 16), 8, 2, nothing)
    assert found == [[Hypothesis([], 0.0, 0.0)]] * 8


@torch.inference_mode()
def test_wrong_decoders_and_budgets_are_errors(
    model: Seq2SeqTransformer, src: torch.Tensor
) -> None:
    with pytest.raises(ValueError, match="a decoder of 16 rows, got 8"):
        graphed_beam_search(decoder(model, src, 20, 8), 8, 2, MAX_LENGTHS)
    with pytest.raises(ValueError, match="a budget of 20 tokens needs a decoder of 20 steps"):
        graphed_greedy_search(decoder(model, src, 10, 8), 8, MAX_LENGTHS)
    with pytest.raises(ValueError, match="max_lengths must have shape"):
        graphed_greedy_search(decoder(model, src, 20, 8), 8, MAX_LENGTHS[:3])
    with pytest.raises(ConfigError, match="beam_size must be >= 1"):
        graphed_beam_search(decoder(model, src, 20, 8), 8, 0, MAX_LENGTHS)
