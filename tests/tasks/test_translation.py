"""The translation task's data settings and the checks on them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from qkv.data.cache import CACHE_FILE
from qkv.data.token_array import TokenArray
from qkv.errors import ConfigError, DataError
from qkv.model.config import ModelConfig
from qkv.model.seq2seq import Seq2SeqTransformer
from qkv.run import build_model
from qkv.tasks.translation import TranslationData, TranslationTask, prepare
from qkv.training.config import TrainConfig
from tests.model.helpers import tiny_config

GOOD = Path(__file__).resolve().parents[1] / "corpus" / "translation" / "good"


@pytest.mark.parametrize(
    ("field", "value"), [("valid_sentences", -200), ("max_len", 0), ("tokenizer_sample", -1)]
)
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


def test_a_model_too_large_for_memory_is_a_config_error_and_other_errors_pass() -> None:
    """torch's allocators are known by their messages; any other RuntimeError is left as it is."""
    config = ModelConfig(d_model=16, n_heads=2, d_ff=32, vocab_size=50)

    def failing(message: str) -> Callable[[ModelConfig], Seq2SeqTransformer]:
        def factory(config: ModelConfig) -> Seq2SeqTransformer:
            raise RuntimeError(message)

        return factory

    for message in (
        "[enforce fail] DefaultCPUAllocator: can't allocate 9 GB",
        "CUDA out of memory",
    ):
        with pytest.raises(ConfigError, match=r"the model does not fit in memory \(d_model 16"):
            build_model(failing(message), config)
    with pytest.raises(RuntimeError, match="something else"):
        build_model(failing("something else"), config)


def test_training_tokens_are_read_from_the_cache_not_held_in_memory(tmp_path: Path) -> None:
    data = TranslationData(data_dir=str(GOOD), vocab_size=100, min_frequency=1)
    tokenizer, corpora, refs = prepare(data, tmp_path, None, 256)
    task = TranslationTask(
        Seq2SeqTransformer(tiny_config()), tokenizer, corpora, refs, TrainConfig(max_tokens=64)
    )
    assert isinstance(task.src, TokenArray) and task.src.on_disk and task.tgt.on_disk
    assert len(task.src) == 40 and isinstance(task.valid_src, list)
    batches = task.batches(0)
    assert all(isinstance(batch, np.ndarray) for batch in batches)
    assert sorted(i for batch in batches for i in batch.tolist()) == list(range(40))
    lines = (GOOD / "train.de").read_text(encoding="utf-8").splitlines()
    assert task.src.tolist() == tokenizer.encode_batch(lines)


def test_validation_files_that_hold_the_training_pairs_are_warned_of(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = TranslationData(data_dir=str(GOOD), vocab_size=100, min_frequency=1)
    prepare(data, tmp_path / "apart", None, 256)
    assert "warning" not in capsys.readouterr().out
    copied = tmp_path / "copied"
    copied.mkdir()
    for side in ("de", "en"):
        train = (GOOD / f"train.{side}").read_bytes()
        (copied / f"train.{side}").write_bytes(train)
        (copied / f"val.{side}").write_bytes(train)
    prepare(replace(data, data_dir=str(copied)), tmp_path / "same", None, 256)
    assert "warning: the validation files hold the training pairs" in capsys.readouterr().out


def test_a_resumed_run_rebuilds_a_cache_cut_short(tmp_path: Path) -> None:
    data = TranslationData(data_dir=str(GOOD), vocab_size=100, min_frequency=1)
    tokenizer, corpora, _ = prepare(data, tmp_path, None, 256)
    expected = {name: rows.tolist() for name, rows in corpora.items()}
    cache = tmp_path / CACHE_FILE
    whole = cache.read_bytes()
    cache.write_bytes(whole[: len(whole) // 2])
    _, corpora, _ = prepare(data, tmp_path, tokenizer, 256)
    assert {name: rows.tolist() for name, rows in corpora.items()} == expected
    assert cache.read_bytes() == whole
