"""The real-data decoding benchmark: the weight mapping to Marian, and a run end to end."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from qkv.cli import main as qkv_main
from qkv.data.special import BOS_ID, EOS_ID, PAD_ID
from qkv.model import ModelConfig, Seq2SeqTransformer
from qkv.tasks.dates import generate_date_pairs

pytest.importorskip("transformers", reason="the Hugging Face side needs pip install -e .[bench]")

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def real_decode(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    for name in ("real_decode", "peers", "workload"):
        sys.modules.pop(name, None)  # a fresh import under the patched path
    import real_decode as module

    return module


def tiny_config(**changes: object) -> ModelConfig:
    values: dict[str, object] = {
        "vocab_size": 40,
        "d_model": 16,
        "n_heads": 2,
        "d_ff": 32,
        "n_encoder_layers": 2,
        "n_decoder_layers": 2,
        "max_len": 64,
    }
    values.update(changes)
    return ModelConfig(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "changes",
    [{"tie_embeddings": True}, {"tie_embeddings": False, "tgt_vocab_size": 30}],
    ids=["tied", "separate vocabularies"],
)
def test_marian_computes_the_same_logits(real_decode: ModuleType, changes: dict) -> None:
    model = Seq2SeqTransformer(tiny_config(**changes)).eval()
    marian = real_decode.marian_from_qkv(model)
    src = torch.tensor([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]])  # (B, S), padded
    tgt = torch.tensor([[1, 4, 5, 0], [1, 6, 7, 8]])  # (B, T)
    with torch.inference_mode():
        ours = model(src, tgt)  # (B, T, V)
        theirs = marian(
            input_ids=src,
            attention_mask=src != 0,
            decoder_input_ids=tgt,
            decoder_attention_mask=tgt != 0,
        ).logits
    real = tgt != 0  # padded target positions are not compared
    torch.testing.assert_close(theirs[real], ours[real], atol=1e-5, rtol=1e-5)


def test_the_marian_special_ids_are_qkvs(real_decode: ModuleType) -> None:
    from peers import MARIAN_TOKENS

    assert MARIAN_TOKENS["pad_token_id"] == PAD_ID
    assert MARIAN_TOKENS["bos_token_id"] == MARIAN_TOKENS["decoder_start_token_id"] == BOS_ID
    assert MARIAN_TOKENS["eos_token_id"] == EOS_ID


def test_pre_norm_models_are_refused(real_decode: ModuleType) -> None:
    model = Seq2SeqTransformer(tiny_config(norm_first=True))
    with pytest.raises(ValueError, match="post-norm"):
        real_decode.marian_from_qkv(model)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("real_decode")
    data = root / "data"
    data.mkdir()
    for split, count, seed in (("train", 300, 1), ("val", 20, 2), ("test", 24, 3)):
        pairs = generate_date_pairs(count, seed=seed)
        (data / f"{split}.src").write_text("".join(s + "\n" for s, _ in pairs), "utf-8")
        (data / f"{split}.tgt").write_text("".join(t + "\n" for _, t in pairs), "utf-8")
    run = root / "run"
    code = qkv_main(
        [
            *("train", "translation", "--data", str(data), "--src", "src", "--tgt", "tgt"),
            *("--out", str(run), "--preset", "tiny", "vocab_size=120", "max_steps=30"),
            *("eval_every=30", "threads=1"),
        ]
    )
    assert code == 0
    return run, data / "test.src", data / "test.tgt"


def test_every_way_decodes_and_greedy_agrees(
    real_decode: ModuleType, tiny_run: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    run, src, ref = tiny_run
    out_json, out_md = tmp_path / "real.json", tmp_path / "real.md"
    argv = [*("--run", str(run), "--src", str(src), "--ref", str(ref), "--batch", "8")]
    argv += [*("--beam", "3", "--repeats", "1", "--threads", "1")]
    real_decode.main([*argv, "--json", str(out_json), "--md", str(out_md)])
    results = json.loads(out_json.read_text())
    assert results["sentences"] == 24
    rows = {(r["search"], r["way"]): r for r in results["rows"]}
    ways = ("qkv, same batches", "hf, same batches", "qkv, sorted batches")
    ways += ("hf, sorted batches", "qkv, own batching")
    assert set(rows) == {(s, w) for s in ("greedy", "beam-3") for w in ways}
    assert all(r["sentences_per_s"] > 0 and 0 <= r["bleu"] <= 100 for r in rows.values())
    # The same weights and the same batches: greedy search must find the same tokens.
    assert rows["greedy", "qkv, same batches"]["same_as_hf"] >= 0.9
    assert rows["greedy", "hf, same batches"]["same_as_hf"] is None
    assert "| greedy | qkv, same batches |" in out_md.read_text()


def test_bf16_adds_a_way_for_each_tool(
    real_decode: ModuleType, tiny_run: tuple[Path, Path, Path]
) -> None:
    run, src, ref = tiny_run
    argv = [*("--run", str(run), "--src", str(src), "--ref", str(ref), "--batch", "8")]
    argv += [*("--beam", "2", "--repeats", "1", "--threads", "1", "--bf16")]
    results = real_decode.main(argv)
    rows = {(r["search"], r["way"]): r for r in results["rows"]}
    for search in ("greedy", "beam-2"):
        qkv, hf = rows[search, "qkv, own batching, bf16"], rows[search, "hf, sorted batches, bf16"]
        assert qkv["sentences_per_s"] > 0 and hf["sentences_per_s"] > 0
        assert qkv["same_as_hf"] is not None and hf["same_as_hf"] is None
    # bf16 rounding may change a few tokens, not the translations as a whole
    fp32 = rows["greedy", "qkv, own batching"]["bleu"]
    assert abs(rows["greedy", "qkv, own batching, bf16"]["bleu"] - fp32) <= 10


def test_a_missing_run_is_one_line_not_a_traceback(real_decode: ModuleType, tmp_path: Path) -> None:
    lines = tmp_path / "lines.txt"
    lines.write_text("ein Satz\n", encoding="utf-8")
    argv = ["--run", str(tmp_path / "nowhere"), "--src", str(lines), "--ref", str(lines)]
    with pytest.raises(SystemExit, match=r"real_decode.py: .*nowhere"):
        real_decode.main(argv)


def test_a_batch_of_zero_is_refused(
    real_decode: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--run", str(tmp_path), "--src", "a", "--ref", "b", "--batch", "0"]
    with pytest.raises(SystemExit) as exit_info:
        real_decode.main(argv)
    assert exit_info.value.code == 2
    assert "--batch: expected an integer >= 1, got '0'" in capsys.readouterr().err
