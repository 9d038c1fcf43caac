"""A finished run names the signs of a wasted one, and only those."""

from __future__ import annotations

from typing import Any

from qkv.training.verdict import run_warnings


def run(steps: int, accuracies: list[float], every: int = 100) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = [
        {"split": "train", "step": s, "loss": 0.5} for s in range(50, steps + 1, 50)
    ]
    for i, accuracy in enumerate(accuracies, start=1):
        records.append({"split": "valid", "step": i * every, "accuracy": accuracy, "loss": 0.4})
    return records


def test_a_healthy_run_has_no_warnings() -> None:
    assert run_warnings(run(3000, [0.7, 0.8, 0.85]), 300, "accuracy", 0.5) == []


def test_a_run_that_ends_in_warm_up_says_so() -> None:
    (warning,) = run_warnings(run(30, [0.6], every=30), 300, "accuracy", 0.5)
    assert "step 30, within its warm-up of 300 steps" in warning
    (warning,) = run_warnings(run(400, [0.6]), 300, "accuracy", 0.5)
    assert "just after its warm-up" in warning


def test_a_run_that_never_validated_says_so() -> None:
    (warning,) = run_warnings(run(2000, []), 100, "accuracy", 0.5)
    assert "never validated" in warning


def test_a_run_at_chance_says_so() -> None:
    (warning,) = run_warnings(run(2000, [0.52, 0.55]), 100, "accuracy", 0.55)
    assert "never beat 0.55, what always the commonest label would score" in warning
    records = [
        {**r, "bleu": r.pop("accuracy")} if "accuracy" in r else r for r in run(2000, [0.5, 0.8])
    ]
    (warning,) = run_warnings(records, 100, "bleu", 1.0)
    assert "never beat 1, what empty translations would score" in warning


def test_a_non_finite_loss_is_named() -> None:
    records = run(2000, [0.9])
    records[3]["loss"] = float("nan")
    (warning,) = run_warnings(records, 100, "accuracy", 0.5)
    assert "non-finite" in warning
    assert "3 batch(es) skipped" in run_warnings(run(2000, [0.9]), 100, "accuracy", 0.5, 3)[0]
