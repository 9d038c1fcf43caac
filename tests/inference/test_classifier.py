"""`Classifier` over a tiny untrained model: what it accepts and what it leaves as it was."""

from __future__ import annotations

import copy

import pytest
import torch

from qkv import fast
from qkv.data.tokenizer import Tokenizer
from qkv.errors import ConfigError
from qkv.inference.classifier import Classifier
from qkv.model.classifier import TextClassifier
from qkv.tasks.classification import ClassificationData
from tests.model.helpers import tiny_config

TEXTS = ["a warm and funny film", "dull, slow and far too long", "I loved it", "the worst"]


@pytest.fixture(scope="module")
def classifier() -> Classifier:
    tokenizer = Tokenizer.train(TEXTS * 5, vocab_size=60, min_frequency=1)
    torch.manual_seed(0)
    config = tiny_config(
        vocab_size=tokenizer.vocab_size, n_decoder_layers=0, n_classes=2, head_dropout=0.5
    )
    data = ClassificationData(labels=["neg", "pos"], max_len=16)
    return Classifier(TextClassifier(config), tokenizer, data, torch.device("cpu"))


def test_a_model_left_in_training_mode_gives_the_same_probabilities(
    classifier: Classifier,
) -> None:
    expected = classifier.probabilities(TEXTS)
    classifier.model.train()
    try:
        for _ in range(3):  # dropout of 0.5 would change them every time
            torch.testing.assert_close(classifier.probabilities(TEXTS), expected)
        assert classifier.model.training  # and the mode stays the caller's
    finally:
        classifier.model.eval()


def test_a_model_turned_fast_gives_the_reference_probabilities(classifier: Classifier) -> None:
    """`Classifier.load` classifies with the model that `qkv.fast.apply` turned fast."""
    model = fast.apply(copy.deepcopy(classifier.model))
    quick = Classifier(model, classifier.tokenizer, classifier.data, classifier.device)  # type: ignore[arg-type]
    texts = [*TEXTS, "a film", "too long, far too long and slow, and dull"]
    torch.testing.assert_close(quick.probabilities(texts), classifier.probabilities(texts))


def test_texts_may_come_from_a_generator(classifier: Classifier) -> None:
    assert classifier.predict(t for t in TEXTS) == classifier.predict(TEXTS)  # type: ignore[arg-type]


@pytest.mark.parametrize("texts", [["fine", None], ["fine", b"bytes"]], ids=str)
def test_texts_must_be_strings(classifier: Classifier, texts: list[object]) -> None:
    with pytest.raises(TypeError, match="texts must be strings"):
        classifier.predict(texts)  # type: ignore[arg-type]


@pytest.mark.parametrize("blank", ["", "<br /><br />", "\u200b\u200b"])
def test_a_text_with_nothing_to_read_is_refused(classifier: Classifier, blank: str) -> None:
    with pytest.raises(ConfigError, match="text 2 has no tokens once cleaned"):
        classifier.predict(["fine", blank])


@pytest.mark.parametrize("max_tokens", [None, 0, 2.5, True])
def test_a_batch_budget_that_is_not_a_count_is_refused(
    classifier: Classifier, max_tokens: object
) -> None:
    with pytest.raises(ConfigError, match="max_tokens must be an int >= 1"):
        classifier.predict(TEXTS, max_tokens=max_tokens)  # type: ignore[arg-type]


def test_a_small_batch_budget_gives_the_same_predictions(classifier: Classifier) -> None:
    one_at_a_time, together = classifier.predict(TEXTS, max_tokens=1), classifier.predict(TEXTS)
    assert [label for label, _ in one_at_a_time] == [label for label, _ in together]
    assert [p for _, p in one_at_a_time] == pytest.approx([p for _, p in together], abs=1e-6)


@pytest.mark.parametrize("texts", [set(TEXTS), dict.fromkeys(TEXTS)], ids=["set", "dict"])
def test_texts_without_an_order_are_refused(classifier: Classifier, texts: object) -> None:
    with pytest.raises(TypeError, match="texts must be a list of strings, not"):
        classifier.predict(texts)  # type: ignore[arg-type]
