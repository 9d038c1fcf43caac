"""Decoding in bfloat16: a copy in bf16, the same function up to bf16 rounding, clear refusals."""

from __future__ import annotations

import pytest
import torch

from qkv.errors import ConfigError
from qkv.inference import precision
from qkv.inference.incremental import ModelDecoder
from qkv.inference.precision import decoding_model
from qkv.inference.translate import DecodeOptions, translate_ids
from qkv.model.seq2seq import Seq2SeqTransformer
from tests.model.helpers import random_ids, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = torch.device("cpu")


@pytest.fixture
def model() -> Seq2SeqTransformer:
    torch.manual_seed(0)
    return Seq2SeqTransformer(tiny_config(vocab_size=60)).eval()


def test_float32_decoding_uses_the_model_itself(model: Seq2SeqTransformer) -> None:
    assert decoding_model(model, False, CPU) is model


def test_the_bf16_copy_leaves_the_model_as_it_was(model: Seq2SeqTransformer) -> None:
    before = {name: p.clone() for name, p in model.state_dict().items()}
    copy = decoding_model(model, True, CPU)
    assert copy is not model and not copy.training
    assert {p.dtype for p in copy.parameters()} == {torch.bfloat16}
    for name, p in model.state_dict().items():
        assert p.dtype == before[name].dtype and torch.equal(p, before[name]), name


def test_bf16_steps_compute_the_float32_logits_up_to_rounding(model: Seq2SeqTransformer) -> None:
    src = random_ids(4, 7, vocab=60)  # (B, S)
    with torch.no_grad():
        exact = ModelDecoder(model, src, 6)
        rounded = ModelDecoder(decoding_model(model, True, CPU), src, 6)
        tokens = torch.full((4,), 1)  # BOS
        for _ in range(5):
            logits = exact.step(tokens)  # (B, V)
            approx = rounded.step(tokens)  # (B, V), float32 for the search
            assert approx.dtype == torch.float32
            error = (approx - logits).abs().max().item()
            # bf16 keeps ~3 digits: a few % of the logits' spread here; a wrong weight,
            # scale or mask would be off by about the whole spread.
            assert error < 0.1 * logits.std().item(), error
            tokens = logits.argmax(-1)  # (B,) both follow the float32 path


@pytest.mark.parametrize("options", [{"beam_size": 1}, {"beam_size": 3}, {"sampling": True}])
def test_bf16_translation_runs_every_search(
    model: Seq2SeqTransformer, options: dict[str, object]
) -> None:
    sources = [[5, 6, 7, 8], [], [9, 10], [11] * 9]
    found = translate_ids(
        model,
        sources,
        DecodeOptions(bf16=True, max_len_b=4, **options),
        CPU,  # type: ignore[arg-type]
    )
    assert len(found) == 4 and found[1] == []
    for tokens, source in zip(found, sources, strict=True):
        assert len(tokens) <= int(1.5 * len(source)) + 4
        assert all(0 <= t < 60 for t in tokens)
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_bf16_output_does_not_depend_on_the_workers(model: Seq2SeqTransformer) -> None:
    sources = [[5 + i % 50, 6, 7 + i % 40] for i in range(12)]
    found = [
        translate_ids(model, sources, DecodeOptions(bf16=True, max_tokens=8, workers=workers), CPU)
        for workers in (1, 2)
    ]
    assert found[0] == found[1]


def test_a_cpu_without_native_bf16_gets_a_warning(
    monkeypatch: pytest.MonkeyPatch, model: Seq2SeqTransformer
) -> None:
    monkeypatch.setattr(precision, "cpu_bf16_matmuls", lambda: False)
    with pytest.warns(UserWarning, match="no native bfloat16 .* slower than float32"):
        copy = decoding_model(model, True, CPU)
    assert next(copy.parameters()).dtype == torch.bfloat16


def test_a_gpu_without_bf16_is_refused(
    monkeypatch: pytest.MonkeyPatch, model: Seq2SeqTransformer
) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    with pytest.raises(ConfigError, match="needs a GPU that supports bfloat16"):
        decoding_model(model, True, torch.device("cuda"))
