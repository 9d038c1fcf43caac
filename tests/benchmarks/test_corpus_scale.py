"""The corpus-scale benchmark on a small made-up Multi30k: corpora, timings, peak RSS, table."""

from __future__ import annotations

import argparse
import gzip
import sys
from pathlib import Path
from types import ModuleType

import pytest

from qkv.data.tokenizer import Tokenizer

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
SRC = ["ein Hund läuft .", "zwei Kinder spielen im Park .", "eine Frau liest ein Buch ."]
TGT = ["a dog runs .", "two children play in the park .", "a woman reads a book ."]


@pytest.fixture
def corpus_scale(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    sys.modules.pop("corpus_scale", None)
    import corpus_scale as module

    return module


@pytest.fixture
def multi30k(tmp_path: Path) -> Path:
    directory = tmp_path / "multi30k"
    directory.mkdir()
    for split in ("train", "val"):
        for lang, lines in (("de", SRC), ("en", TGT)):
            with gzip.open(directory / f"{split}.{lang}.gz", "wt", encoding="utf-8") as out:
                out.write("".join(line + "\n" for line in lines))
    return directory


def test_a_corpus_is_made_of_aligned_multi30k_pairs(
    corpus_scale: ModuleType, multi30k: Path, tmp_path: Path
) -> None:
    corpus = corpus_scale.generate(multi30k, 500, tmp_path / "c")
    de = (corpus / "train.de").read_text(encoding="utf-8").splitlines()
    en = (corpus / "train.en").read_text(encoding="utf-8").splitlines()
    assert len(de) == len(en) == 500
    pairs = dict(zip(SRC, TGT, strict=True))
    for src, tgt in zip(de, en, strict=True):
        first = next(s for s in SRC if src.startswith(s))  # one pair, or two joined
        second = src[len(first) + 1 :]
        assert tgt == " ".join(filter(None, [pairs[first], pairs.get(second, "")]))
    assert 0 < sum(src in SRC for src in de) < 500  # some single, some joined
    assert corpus_scale.generate(multi30k, 500, tmp_path / "c") == corpus  # kept, not remade


def test_tokenizing_timings_and_the_table(
    corpus_scale: ModuleType, multi30k: Path, tmp_path: Path
) -> None:
    corpus = corpus_scale.generate(multi30k, 300, tmp_path / "c")
    tokenizer = Tokenizer.train(SRC + TGT, vocab_size=60, min_frequency=1)
    tokenizer.save(tmp_path / "tokenizer.json")
    assert corpus_scale.qkv_seconds(tokenizer, corpus, tmp_path) > 0
    assert not (tmp_path / "tokens.safetensors").exists()  # removed after timing
    chunks = list(corpus_scale.raw_chunks(corpus))
    assert sum(len(chunk) for chunk in chunks) == 600  # both sides of every pair
    assert corpus_scale.raw_seconds(tmp_path / "tokenizer.json", chunks, "encode_batch") > 0
    rows = [
        {"pairs": 300, "encode_batch": 100.0, "encode_batch_fast": 200.0, "qkv": 180.0},
        {"pairs": 900, "peak_rss_mib": 700.0, "train_s": 12.0},
        {"pairs": 2700, "peak_rss_mib": 770.0, "train_s": 30.0},
    ]
    table = corpus_scale.table(rows).splitlines()
    assert table[2] == "| 300 | 100 | 200 | 180 | 90% | — | — | — |"
    assert table[4] == "| 2,700 | — | — | — | — | 770 | 1.10 | 30 |"


def test_the_peak_rss_of_a_training_run(
    corpus_scale: ModuleType, multi30k: Path, tmp_path: Path
) -> None:
    corpus = corpus_scale.generate(multi30k, 200, tmp_path / "c")
    args = argparse.Namespace(
        steps=2, threads=1, tokenizer_sample=100, src=BENCH_DIR.parent / "src"
    )
    found = corpus_scale.peak_rss(corpus, tmp_path / "run", args)
    assert found["peak_rss_mib"] > 50 and found["train_s"] > 0
    assert (tmp_path / "run" / "model.safetensors").exists()
