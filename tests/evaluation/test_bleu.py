"""BLEU and chrF through sacreBLEU, and what the scorer refuses."""

from __future__ import annotations

import pytest
from sacrebleu.metrics import BLEU

from qkv.evaluation.bleu import score_translations


def test_scores_are_sacrebleus() -> None:
    hypotheses = ["a man rides a bike .", "two dogs play in the snow ."]
    references = ["a man rides a bicycle .", "two dogs play in the snow ."]
    scores = score_translations(hypotheses, references)
    assert scores.bleu == BLEU().corpus_score(hypotheses, [references]).score
    assert scores.sentences == 2 and 0 < scores.chrf <= 100


def test_one_string_is_not_a_list_of_sentences() -> None:
    with pytest.raises(TypeError, match="not one string"):
        score_translations("a man", "a man")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("hypotheses", "references", "message"),
    [([], [], "no sentences to score"), (["a"], [], "1 hypotheses but 0 references")],
)
def test_empty_or_unequal_lists_are_refused(
    hypotheses: list[str], references: list[str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        score_translations(hypotheses, references)
