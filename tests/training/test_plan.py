"""The plan: presets unchanged on the data they were tuned on, sensible on any other size."""

from __future__ import annotations

import pytest

from qkv.presets import (
    SMALL_DATA,
    classification_preset,
    fitted_classification,
    translation_preset,
)
from qkv.training.plan import MIN_EVALS, MIN_STEPS, WARMUP_SHARE, plan_training

MULTI30K = (29_000, 29_000 * 16)  # examples, padded tokens of a pass
IMDB = {"seed": (25_000, 25_000 * 80), "strong": (25_000, 25_000 * 300)}


@pytest.mark.parametrize("name", ["multi30k-cpu", "multi30k-gpu"])
def test_translation_presets_are_unchanged_on_multi30k(name: str) -> None:
    _, config = translation_preset(name)
    _, planned = plan_training(config, *MULTI30K)
    assert planned == config


@pytest.mark.parametrize("name", ["seed", "strong"])
def test_classification_presets_are_unchanged_on_imdb(name: str) -> None:
    _, config, _ = classification_preset(name)
    _, planned = plan_training(config, *IMDB[name])
    assert planned == config


@pytest.mark.parametrize("examples", [2_000, 7_000, 50_000, 5_000_000])
@pytest.mark.parametrize("name", ["seed", "strong"])
def test_every_size_gets_a_whole_schedule(name: str, examples: int) -> None:
    _, config, _ = classification_preset(name)
    plan, planned = plan_training(config, examples, examples * 25)
    assert plan.steps >= MIN_STEPS
    assert plan.warmup <= WARMUP_SHARE * plan.steps
    assert plan.steps // plan.eval_every >= MIN_EVALS
    assert plan.steps_per_epoch * planned.max_epochs >= plan.steps
    assert (planned.warmup, planned.eval_every) == (plan.warmup, plan.eval_every)


def test_seven_thousand_short_texts_no_longer_end_in_warm_up() -> None:
    """The case that went wrong: 7,000 sentences under `strong` planned 33 steps, warm-up 300."""
    _, config, _ = classification_preset("strong")
    plan, _ = plan_training(config, 7_000, 7_000 * 25)
    assert plan.steps >= MIN_STEPS > 3 * plan.warmup
    assert "7,000 examples" in plan.describe() and "steps planned" in plan.describe()


def test_explicit_settings_are_kept() -> None:
    _, config, _ = classification_preset("strong")
    explicit = frozenset({"max_tokens", "max_epochs", "warmup", "eval_every"})
    _, planned = plan_training(config, 7_000, 7_000 * 25, explicit)
    assert planned == config


def test_max_steps_bounds_the_plan() -> None:
    _, config = translation_preset("tiny")
    plan, _ = plan_training(config.__class__(**{**config.to_dict(), "max_steps": 40}), 400, 4000)
    assert plan.steps == 40
    assert plan.warmup <= 24 and plan.eval_every <= 8
    big, _ = plan_training(config.__class__(**{**config.to_dict(), "max_steps": 40}), 10**6, 10**8)
    assert f"40 steps planned ({40 / big.steps_per_epoch:.3g} epochs of" in big.describe()


def test_only_small_classification_data_is_fitted() -> None:
    assert fitted_classification(SMALL_DATA) == {}  # IMDB's 25,000 reviews: `strong` as it is
    small = fitted_classification(7000)
    assert int(small["vocab_size"]) < 16000 and float(small["dropout"]) > 0.2
    # Validated often enough to catch the best weights before the labels are learnt by heart.
    assert int(small["eval_every"]) * 20 <= MIN_STEPS
