"""`Translator` over a tiny untrained model: what it accepts."""

from __future__ import annotations

import pytest
import torch

from qkv.data.tokenizer import Tokenizer
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
