"""Batched translation of ids: DecodeOptions' checks and the progress bar."""

from __future__ import annotations

import io
import math
import sys

import pytest
import torch

from qkv.errors import ConfigError
from qkv.inference.translate import (
    DecodeOptions,
    sentence_seeds,
    translate_hypotheses,
    translate_ids,
)
from qkv.model.seq2seq import Seq2SeqTransformer
from tests.inference.helpers import fast_copy
from tests.model.helpers import tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

BAD = {
    "beam size 0": ({"beam_size": 0}, "beam size must be between 1 and 256, got 0"),
    "negative beam size": ({"beam_size": -2}, "beam size must be between 1 and 256, got -2"),
    "negative max_len_a": ({"max_len_a": -1.0}, "max_len_a and max_len_b must be >= 0"),
    "negative max_len_b": ({"max_len_b": -3}, "max_len_a and max_len_b must be >= 0"),
    "no tokens per batch": ({"max_tokens": 0}, "max_tokens must be >= 1, got 0"),
    "temperature 0": ({"temperature": 0.0}, "temperature must be a number > 0"),
    "temperature NaN": ({"temperature": float("nan")}, "temperature must be a number > 0"),
    "beam too wide": ({"beam_size": 257}, "beam size must be between 1 and 256, got 257"),
    "alpha too large": ({"alpha": 11.0}, "alpha must be between 0 and 10"),
    "alpha NaN": ({"alpha": float("nan")}, "alpha must be between 0 and 10"),
    "negative top_k": ({"top_k": -1}, "top_k must be >= 0"),
    "top_p 0": ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    "top_p above 1": ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    "negative workers": ({"workers": -1}, r"workers must be >= 0 \(0: as many as pay\), got -1"),
    "infinite max_len_a": ({"max_len_a": math.inf}, "max_len_a and max_len_b must be >= 0"),
    "max_len_a NaN": ({"max_len_a": math.nan}, "max_len_a and max_len_b must be >= 0"),
    "seed too large": ({"seed": 2**64}, r"seed must be between 0 and 2\*\*63 - 1"),
    "fractional beam": ({"beam_size": 2.5}, r"beam_size must be int, got 2.5 \(float\)"),
    "whole float workers": ({"workers": 2.0}, r"workers must be int, got 2.0 \(float\)"),
    "infinite max_len_b": ({"max_len_b": math.inf}, "max_len_b must be int"),
    "fractional seed": ({"seed": 1.5}, "seed must be int"),
    "string flag": ({"bf16": "no"}, r"bf16 must be bool, got 'no' \(str\)"),
    "string number": ({"beam_size": "5"}, "beam_size must be int"),
}


@pytest.mark.parametrize(("fields", "message"), BAD.values(), ids=BAD.keys())
def test_out_of_range_settings_are_config_errors(fields: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DecodeOptions(**fields)  # type: ignore[arg-type]


def test_defaults_and_edges_are_accepted() -> None:
    DecodeOptions()
    DecodeOptions(beam_size=1, max_len_a=0.0, max_len_b=0, max_tokens=1, top_k=0, top_p=1.0)


def test_a_budget_of_nothing_translates_to_nothing() -> None:
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(vocab_size=60, max_len=12))
    sources, cpu = [[5, 6, 7], [8, 9]], torch.device("cpu")
    for beam in (1, 3):
        options = DecodeOptions(beam_size=beam, max_len_a=0.0, max_len_b=0)
        assert translate_ids(model, sources, options, cpu) == [[], []]


@pytest.mark.parametrize("training", [True, False])
def test_the_callers_model_keeps_its_mode(training: bool) -> None:
    model = Seq2SeqTransformer(tiny_config(vocab_size=60, max_len=12)).train(training)
    translate_ids(model, [[5, 6, 7]], DecodeOptions(max_len_b=3), torch.device("cpu"))
    assert model.training is training


def test_a_huge_length_budget_is_the_models_longest() -> None:
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(vocab_size=60, max_len=12))
    sources, cpu = [[5, 6, 7], [8, 9]], torch.device("cpu")
    large = translate_ids(model, sources, DecodeOptions(beam_size=1, max_len_a=100.0), cpu)
    assert max(len(tokens) for tokens in large) > 1
    for huge in (
        {"max_len_a": 1e30},
        {"max_len_a": 10**30},
        {"max_len_b": 10**30},
        {"max_len_b": 2**63 - 1},
    ):
        assert translate_ids(model, sources, DecodeOptions(beam_size=1, **huge), cpu) == large


@pytest.mark.parametrize("token", [60, -1])
def test_a_token_id_outside_the_vocabulary_is_refused_before_decoding(token: int) -> None:
    model = Seq2SeqTransformer(tiny_config(vocab_size=60, max_len=12))
    message = rf"sources\[1\] holds token id {token}, outside the vocabulary \[0, 60\)"
    with pytest.raises(ValueError, match=message):
        translate_ids(model, [[5, 6], [7, token, 8]], DecodeOptions(), torch.device("cpu"))


def test_a_sampled_translation_depends_on_seed_and_place_not_on_batching() -> None:
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(vocab_size=60, max_len=40))
    sources, cpu = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]], torch.device("cpu")

    def run(sources: list[list[int]], seed: int = 3, max_tokens: int = 6000) -> list[list[int]]:
        options = DecodeOptions(sampling=True, seed=seed, max_len_b=8, max_tokens=max_tokens)
        return translate_ids(model, sources, options, cpu)

    together = run(sources)
    assert run(sources, max_tokens=1) == together  # one sentence per batch
    neighbours = [[20, 21], sources[1], [22, 23, 24, 25, 26], sources[3]]
    changed = run(neighbours)
    assert [changed[1], changed[3]] == [together[1], together[3]]
    assert run(sources, seed=4) != together


def test_an_input_sampled_in_parts_samples_as_it_would_whole() -> None:
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(vocab_size=60, max_len=40))
    sources, cpu = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14], [15, 16]], torch.device("cpu")
    options = DecodeOptions(sampling=True, seed=3, max_len_b=8)

    def run(part: list[list[int]], start: int = 0) -> list[list[int]]:
        found = translate_hypotheses(model, part, options, cpu, scored=False, start=start)
        return [hypotheses[0][0] for hypotheses in found]

    whole = run(sources)
    assert run(sources[:2]) + run(sources[2:], start=2) == whole
    assert run(sources[2:]) != whole[2:]  # the place counts, not the place in the part
    for start in (-1, 1.5):
        with pytest.raises(ConfigError, match=r"start must be an int between 0 and 2\*\*63 - 1"):
            run(sources, start=start)  # type: ignore[arg-type]


def test_a_sentence_s_seed_costs_the_same_anywhere_in_the_input() -> None:
    far = 10**15  # drawing every seed before it would take petabytes
    assert sentence_seeds(3, far, 2) == sentence_seeds(3, far - 1, 3)[1:]
    seeds = sentence_seeds(3, 0, 1000)
    assert len(set(seeds)) == 1000 and max(seeds) < 2**62 < max(seeds) * 8
    assert sentence_seeds(4, 0, 5) != seeds[:5]


@pytest.mark.parametrize(
    "fields", [{}, {"beam_size": 4}, {"sampling": True, "top_k": 5, "seed": 3}], ids=str
)
def test_a_model_turned_fast_translates_as_before(fields: dict[str, int]) -> None:
    """`Translator.load` decodes with the model that `qkv.fast.apply` turned fast."""
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(vocab_size=60, max_len=40)).eval()
    generator = torch.Generator().manual_seed(1)
    sources = [
        torch.randint(4, 60, (int(n),), generator=generator).tolist()
        for n in torch.randint(1, 12, (9,), generator=generator)
    ]
    options, cpu = DecodeOptions(max_len_b=6, workers=1, **fields), torch.device("cpu")
    expected = translate_ids(model, sources, options, cpu)
    assert translate_ids(fast_copy(model), sources, options, cpu) == expected
    assert sum(map(len, expected)) > 0


def test_progress_can_be_told_to_a_function_instead(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(vocab_size=60, max_len=40))
    sources = [[5, 6, 7], [], [8, 9], [10] * 5]
    monkeypatch.setattr(sys, "stderr", Terminal())
    told: list[int] = []
    options = DecodeOptions(max_len_b=3, max_tokens=5, workers=1)  # a batch a sentence
    translate_ids(model, sources, options, torch.device("cpu"), told.append)
    assert sum(told) == 4 and len(told) == 4 and sys.stderr.getvalue() == ""


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("progress", [True, False])
def test_progress_bar_only_when_asked_and_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, progress: bool
) -> None:
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(vocab_size=60, max_len=40))
    sources = [[5, 6, 7], [], [8, 9]]
    for stream in (Terminal(), io.StringIO()):
        monkeypatch.setattr(sys, "stderr", stream)
        found = translate_ids(
            model, sources, DecodeOptions(max_len_b=3), torch.device("cpu"), progress
        )
        assert len(found) == 3 and found[1] == []
        drawn = stream.getvalue()
        if progress and isinstance(stream, Terminal):
            assert "/3 " in drawn and "sent/s" in drawn, repr(drawn)  # the blank one counts
        else:
            assert drawn == "", repr(drawn)
