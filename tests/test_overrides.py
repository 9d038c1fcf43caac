import pytest

from qkv import overrides
from qkv.errors import ConfigError
from qkv.model.config import ModelConfig
from qkv.tasks.translation import TranslationData
from qkv.training.config import TrainConfig


def test_values_are_converted_to_field_types() -> None:
    values = overrides.parse_pairs(
        [
            "d_model=64",
            "n_heads=4",
            "norm_first=true",
            "activation=gelu",
            "tgt_vocab_size=none",
            "lr=5e-4",
        ]
    )
    model, rest = overrides.apply(ModelConfig(), values)
    assert (model.d_model, model.norm_first, model.activation) == (64, True, "gelu")
    assert model.tgt_vocab_size is None
    train, rest = overrides.apply(TrainConfig(), rest)
    assert train.lr == 5e-4 and rest == {}


@pytest.mark.parametrize(
    "pair,message",
    [
        ("d_model=big", "cannot read 'big' as int"),
        ("activation=tanh", "not one of"),
        ("norm_first=maybe", "cannot read"),
        ("d_model=30", "divisible"),
    ],
)
def test_bad_values_are_explained(pair: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        overrides.apply(ModelConfig(), overrides.parse_pairs([pair]))


def test_malformed_pairs() -> None:
    with pytest.raises(ConfigError, match="expected key=value"):
        overrides.parse_pairs(["lr"])
    assert overrides.parse_pairs(["max_steps=5", "lr=1e-3", "max_steps=7"])["max_steps"] == "7"


@pytest.mark.parametrize(
    "pair,message",
    [
        ("max_minutes=-1", "max_minutes must be 0"),
        ("max_minutes=inf", "max_minutes must be 0"),  # JSON has no Infinity
        ("clip_norm=inf", "clip_norm must be 0"),
        ("threads=-1", "threads must be 0"),
        ("max_steps=-5", "max_steps must be 0"),
        ("log_every=0", "log_every must be at least 1"),
    ],
)
def test_bad_training_values_are_explained(pair: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        overrides.apply(TrainConfig(), overrides.parse_pairs([pair]))


def test_an_unknown_setting_is_named_with_the_setting_it_is_likely_a_typo_of() -> None:
    values = {"lowercas": "true", "n_head": "4", "warmpu": "10", "colour": "red"}
    with pytest.raises(ConfigError) as error:
        overrides.apply_all(TranslationData(), ModelConfig(), TrainConfig(), values)
    assert str(error.value) == (
        "unknown setting(s): colour, lowercas (did you mean lowercase?), "
        "n_head (did you mean n_heads?), warmpu (did you mean warmup?)"
    )


def test_an_option_given_as_a_setting_is_named_as_the_option() -> None:
    values = {"out": "runs/a", "preset": "small"}
    with pytest.raises(ConfigError) as error:
        overrides.apply_all(TranslationData(), ModelConfig(), TrainConfig(), values)
    assert str(error.value) == (
        "unknown setting(s): out (did you mean --out?), preset (did you mean --preset?)"
    )
