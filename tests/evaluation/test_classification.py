"""Accuracy, macro-F1 and the confusion matrix, against counts worked out by hand."""

from __future__ import annotations

import re

import pytest

from qkv.evaluation.classification import score_classification


def test_scores_of_a_three_label_set() -> None:
    gold = [0, 0, 0, 1, 1, 2]
    predicted = [0, 0, 1, 1, 2, 2]
    scores = score_classification(gold, predicted, ["a", "b", "c"])
    assert scores.confusion == [[2, 1, 0], [0, 1, 1], [0, 0, 1]]
    assert scores.accuracy == pytest.approx(4 / 6)
    # F1 per label: a 2*2/(4+0+1) = 0.8, b 2/(2+1+1) = 0.5, c 2/(2+1+0) = 2/3
    assert scores.macro_f1 == pytest.approx((0.8 + 0.5 + 2 / 3) / 3)
    assert scores.examples == 6


def test_macro_f1_averages_the_labels_that_occur() -> None:
    scores = score_classification([1, 1, 1], [1, 1, 1], ["neg", "pos"])
    assert scores.accuracy == 1.0 and scores.macro_f1 == 1.0
    scores = score_classification([1, 1], [0, 1], ["neg", "pos", "neutral"])
    assert scores.macro_f1 == pytest.approx((0.0 + 2 / 3) / 2)  # neg predicted once, wrongly


def test_lengths_must_match() -> None:
    with pytest.raises(ValueError, match="2 gold labels but 1 predictions"):
        score_classification([0, 1], [0], ["a", "b"])


@pytest.mark.parametrize(
    ("gold", "predicted", "bad"),
    [
        ([0, -1], [0, 1], "gold labels must be indices in [0, 2) of `labels`, got -1"),
        ([0, 1], [0, 5], "predicted labels must be indices in [0, 2) of `labels`, got 5"),
        ([0, 1], [0, "b"], "got 'b'"),
        ([0, True], [0, 1], "got True"),
    ],
)
def test_labels_must_be_indices_of_the_label_list(
    gold: list[int], predicted: list[int], bad: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(bad)):
        score_classification(gold, predicted, ["a", "b"])
