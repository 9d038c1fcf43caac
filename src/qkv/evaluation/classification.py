"""Accuracy, macro-F1 and the confusion matrix."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class ClassificationScores:
    accuracy: float
    macro_f1: float
    confusion: list[list[int]]  # confusion[true][predicted]
    labels: list[str]
    examples: int


def score_classification(
    gold: list[int], predicted: list[int], labels: list[str]
) -> ClassificationScores:
    """Scores of predicted label indices against gold indices. Macro-F1 averages the F1 of the
    labels among the gold labels or the predictions, as scikit-learn's
    `f1_score(average="macro")` does: a label absent from both says nothing."""
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold labels but {len(predicted)} predictions")
    n = len(labels)
    for name, indices in (("gold", gold), ("predicted", predicted)):
        bad = next((i for i in indices if type(i) is not int or not 0 <= i < n), None)
        if bad is not None:
            raise ValueError(f"{name} labels must be indices in [0, {n}) of `labels`, got {bad!r}")
    confusion = np.zeros((n, n), dtype=np.int64)
    np.add.at(confusion, (gold, predicted), 1)
    correct = confusion.diagonal()
    # F1 = 2 tp / (2 tp + fp + fn), where 2 tp + fp + fn = predicted + gold counts of the label
    occurs = confusion.sum(0) + confusion.sum(1)
    f1s = (2 * correct[occurs > 0] / occurs[occurs > 0]).tolist()
    return ClassificationScores(
        accuracy=int(correct.sum()) / max(len(gold), 1),
        macro_f1=sum(f1s) / max(len(f1s), 1),
        confusion=confusion.tolist(),
        labels=labels,
        examples=len(gold),
    )
