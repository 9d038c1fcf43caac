"""The translation task's data settings and the checks on them."""

from __future__ import annotations

from pathlib import Path

import pytest

from qkv.errors import ConfigError, DataError
from qkv.model.config import ModelConfig
from qkv.model.seq2seq import Seq2SeqTransformer
from qkv.run import build_model
from qkv.tasks.translation import TranslationData, prepare

GOOD = Path(__file__).resolve().parents[1] / "corpus" / "translation" / "good"


@pytest.mark.parametrize(("field", "value"), [("valid_sentences", -200), ("max_len", 0)])
def test_settings_out_of_range(field: str, value: int) -> None:
    with pytest.raises(ConfigError, match=field):
        TranslationData(data_dir=str(GOOD), **{field: value})


def test_a_max_len_that_leaves_no_training_pair_is_an_error(tmp_path: Path) -> None:
    data = TranslationData(data_dir=str(GOOD), vocab_size=100, max_len=1)
    with pytest.raises(DataError, match=r"train\.de: no training pair is left: all \d+ are longer"):
        prepare(data, tmp_path, None, 256)


def test_a_model_its_class_refuses_is_a_config_error() -> None:
    config = ModelConfig(d_model=16, n_heads=2, d_ff=32, vocab_size=50, n_decoder_layers=0)
    with pytest.raises(ConfigError, match="n_decoder_layers >= 1"):
        build_model(Seq2SeqTransformer, config)
