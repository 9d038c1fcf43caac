"""`Translator` over a tiny untrained model: what it accepts."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from qkv import fast
from qkv.data.tokenizer import Tokenizer
from qkv.errors import ConfigError
from qkv.inference.translator import Translator
from qkv.model.seq2seq import Seq2SeqTransformer
from tests.model.helpers import tiny_config

SENTENCES = ["ein hund läuft", "zwei kinder spielen", "a dog runs", "two children play"]


@pytest.fixture(scope="module")
def translator() -> Translator:
    tokenizer = Tokenizer.train(SENTENCES * 5, vocab_size=60, min_frequency=1)
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(vocab_size=tokenizer.vocab_size, max_len=32))
    return Translator(model, tokenizer, torch.device("cpu"))


def test_sentences_may_come_from_a_generator(translator: Translator) -> None:
    found = translator.translate(s for s in SENTENCES[:2])  # type: ignore[arg-type]
    assert found == translator.translate(SENTENCES[:2]) and len(found) == 2


def test_blank_sentences_translate_to_nothing(translator: Translator) -> None:
    found = translator.translate(["ein hund", " ", "\u200b", "zwei"], beam_size=1)
    assert found[1:3] == ["", ""]


def test_the_truncation_warning_names_the_callers_line(translator: Translator) -> None:
    long = " ".join(["hund"] * 100)
    for call in (translator.encode, translator.translate):
        with pytest.warns(UserWarning, match="longer than 31 tokens were truncated") as caught:
            call([long])
        assert caught[0].filename == __file__


def test_the_decoder_is_frozen_once_and_decodes_as_a_fresh_call(translator: Translator) -> None:
    """A `Translator` keeps its frozen decoding weights from call to call; each call decodes
    as `translate_hypotheses` with weights made for it alone."""
    from qkv.inference.translate import DecodeOptions, translate_hypotheses

    sources = translator.encode(SENTENCES * 4)
    for beam in (1, 3):
        found = translator.hypotheses(SENTENCES * 4, beam_size=beam, n_best=1)
        made = translator.weights.frozen()
        options = DecodeOptions(beam_size=beam)
        fresh = translate_hypotheses(translator.model, sources, options, translator.device)
        assert [[h.ids for h in hyps] for hyps in found] == [[ids] for ((ids, _),) in fresh]
        assert translator.weights.frozen() is made


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"temperature": 2.0}, "temperature is for sampling=True"),
        ({"top_p": 0.5, "beam_size": 1}, "top_p is for sampling=True"),
        ({"seed": 3}, "seed is for sampling=True"),
        ({"sampling": True, "beam_size": 3}, "beam_size is for beam search"),
        ({"sampling": True, "alpha": 1.0}, "alpha is for beam search"),
    ],
)
def test_an_option_of_the_other_search_is_refused(
    translator: Translator, options: dict[str, float | int | bool], match: str
) -> None:
    """As `qkv translate` refuses `--top-p` without `--sample`: an option silently ignored
    would leave the user believing it did something."""
    with pytest.raises(ConfigError, match=match):
        translator.translate(SENTENCES, **options)


def test_sampling_decodes_one_line_a_sentence_with_or_without_beam_size_1(
    translator: Translator,
) -> None:
    sampled = translator.translate(SENTENCES, sampling=True, seed=4)
    assert translator.translate(SENTENCES, sampling=True, seed=4, beam_size=1) == sampled


@pytest.mark.parametrize(
    ("keyword", "match"),
    [
        ("tempreature", "unknown option 'tempreature' \\(options: beam_size, alpha"),
        ("n_best", "n_best is a keyword of Translator.hypotheses\\(\\)"),
        ("device", "device is a keyword of Translator.load\\(\\)"),
    ],
)
def test_an_unknown_keyword_names_the_options(
    translator: Translator, keyword: str, match: str
) -> None:
    with pytest.raises(TypeError, match=match):
        translator.translate(SENTENCES, **{keyword: 1})


@pytest.mark.parametrize("sentences", [set(SENTENCES), dict.fromkeys(SENTENCES)], ids=str)
def test_sentences_without_an_order_are_refused(translator: Translator, sentences: object) -> None:
    for call in (translator.translate, translator.encode):
        with pytest.raises(TypeError, match="sentences must be a list of strings, not"):
            call(sentences)  # type: ignore[operator]


def test_encode_refuses_one_string(translator: Translator) -> None:
    with pytest.raises(TypeError, match="not one string"):
        translator.encode("ein hund")  # type: ignore[arg-type]


def test_the_device_may_be_given_by_name(translator: Translator) -> None:
    named = Translator(translator.model, translator.tokenizer, "cpu")
    assert named.device == torch.device("cpu")
    assert named.translate(SENTENCES, beam_size=1) == translator.translate(SENTENCES, beam_size=1)


def fast_translator() -> Translator:
    """As `Translator.load` makes it: the model turned fast."""
    tokenizer = Tokenizer.train(SENTENCES * 5, vocab_size=60, min_frequency=1)
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(vocab_size=tokenizer.vocab_size, max_len=32))
    fast.apply(model)
    return Translator(model, tokenizer, torch.device("cpu"))


def test_a_translator_may_be_copied_and_pickled_after_translating() -> None:
    translator = fast_translator()
    expected = translator.translate(SENTENCES, beam_size=2)  # its decoder frozen
    for twin in (copy.deepcopy(translator), pickle.loads(pickle.dumps(translator))):
        assert twin.translate(SENTENCES, beam_size=2) == expected
        assert twin.weights is not translator.weights and twin.weights.model is twin.model


def test_a_model_moved_to_another_dtype_after_translating_decodes_in_it() -> None:
    translator = fast_translator()
    translator.translate(SENTENCES, beam_size=1)
    translator.model.double()  # after the decoder was frozen in float32
    again = translator.translate(SENTENCES, beam_size=1)
    fresh = Translator(translator.model, translator.tokenizer, torch.device("cpu"))
    assert again == fresh.translate(SENTENCES, beam_size=1)
