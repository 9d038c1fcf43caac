import pytest

from qkv.errors import ConfigError
from qkv.model.classifier import TextClassifier
from qkv.model.config import ModelConfig
from qkv.model.seq2seq import Seq2SeqTransformer
from qkv.presets import transformer_base, transformer_small


def test_indivisible_heads_are_explained() -> None:
    with pytest.raises(ConfigError, match=r"d_model \(100\) must be divisible by n_heads \(3\)"):
        ModelConfig(d_model=100, n_heads=3)


@pytest.mark.parametrize(
    "field,value", [("dropout", 1.5), ("activation", "tanh"), ("vocab_size", 0), ("pooling", "max")]
)
def test_bad_values_are_rejected(field: str, value: object) -> None:
    with pytest.raises(ConfigError):
        ModelConfig(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("model", [Seq2SeqTransformer, TextClassifier])
def test_a_model_is_built_from_a_config_not_from_its_fields(model: type) -> None:
    with pytest.raises(TypeError, match="config must be a ModelConfig, got dict"):
        model({"d_model": 64})


def test_round_trip_and_unknown_keys() -> None:
    config = transformer_small(vocab_size=123)
    assert ModelConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match="unknown model config keys: colour"):
        ModelConfig.from_dict({**config.to_dict(), "colour": 1})


def test_base_model_has_the_papers_size() -> None:
    model = Seq2SeqTransformer(transformer_base(vocab_size=37000))
    n = model.num_parameters()
    assert 63e6 <= n <= 65e6, n


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"d_model": 64.0}, "d_model must be of type int, got 64.0"),
        ({"vocab_size": True}, "vocab_size must be of type int, got True"),
        ({"tie_embeddings": "no"}, "tie_embeddings must be of type bool"),
        ({"n_encoder_layers": 1.5}, "n_encoder_layers must be of type int"),
        ({"tgt_vocab_size": 8, "pad_id": 10}, "pad_id must be a token id of both vocabularies"),
    ],
)
def test_values_of_the_wrong_type_or_vocabulary_are_refused(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**{"vocab_size": 64, **fields})  # type: ignore[arg-type]
