"""Corpus scale: qkv's streamed token cache on corpora of millions of sentence pairs.

    python benchmarks/corpus_scale.py --sizes 500000,2000000,5000000 --json scale.json

For each size, Multi30k's training pairs are recombined into a corpus of that many pairs
(each pair a random Multi30k pair, half of them followed by a second one), written under
`--workdir` (never the repository). It reports:

- tokenization: sentences/s (both sides) of qkv's cache building (count, read, check, digest,
  tokenize, filter, write, join: `tokenize_pairs`) against Hugging Face `tokenizers` alone on
  the same text already in memory, in chunks of the same size, with the same trained
  tokenizer (`encode_batch` and `encode_batch_fast`, ids left inside the Encodings), in
  `--rounds` alternated rounds, the best of each kept;
- memory: the peak RSS of `qkv train translation` (tiny preset, `compile=false`, `--steps`
  steps, the tokenizer learnt on `--tokenizer-sample` pairs), a process of its own measured by
  `os.wait4`: reading, BPE learning, tokenizing and training included.

`--compare-workers` also times, on the first size, the other ways tried to spread
tokenization over the cores: no overlap of reading and tokenizing, and a process pool.
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tokenizers import Tokenizer as HfTokenizer  # noqa: E402

from qkv.data import streaming  # noqa: E402
from qkv.data.cache import TokenCacheWriter  # noqa: E402
from qkv.data.lines import CHUNK_LINES, line_chunks  # noqa: E402
from qkv.data.streaming import ParallelFiles, tokenize_pairs  # noqa: E402
from qkv.data.tokenizer import Tokenizer  # noqa: E402

NO_LIMIT = 2**31 - 1  # keep every pair: the same text for both tokenizers


def generate(multi30k: Path, pairs: int, directory: Path, seed: int = 0) -> Path:
    """A corpus of `pairs` recombined Multi30k pairs and Multi30k's validation set, as plain
    text files in `directory` (kept for the next run if complete)."""
    marker = directory / "complete.json"
    if marker.exists() and json.loads(marker.read_text()) == {"pairs": pairs, "seed": seed}:
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    sides = [_gz_lines(multi30k / f"train.{lang}.gz") for lang in ("de", "en")]
    rng = np.random.default_rng(seed)
    first, second = rng.integers(0, len(sides[0]), (2, pairs))
    joined = rng.random(pairs) < 0.5
    for lang, lines in zip(("de", "en"), sides, strict=True):
        with (directory / f"train.{lang}").open("w", encoding="utf-8") as out:
            for start in range(0, pairs, 100_000):
                block = range(start, min(start + 100_000, pairs))
                out.writelines(
                    lines[first[i]] + (f" {lines[second[i]]}\n" if joined[i] else "\n")
                    for i in block
                )
        val = _gz_lines(multi30k / f"val.{lang}.gz")
        (directory / f"val.{lang}").write_text("".join(x + "\n" for x in val), encoding="utf-8")
    marker.write_text(json.dumps({"pairs": pairs, "seed": seed}))
    return directory


def _gz_lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return handle.read().splitlines()


def timed(run: Callable[[], Any]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def qkv_seconds(tokenizer: Tokenizer, corpus: Path, scratch: Path) -> float:
    """Seconds for qkv to build the token cache of the corpus' training pairs."""

    def build() -> None:
        files = ParallelFiles.counted(corpus / "train.de", corpus / "train.en")
        with TokenCacheWriter(scratch / "tokens.safetensors") as writer:
            done = tokenize_pairs(tokenizer, files, writer, ("src", "tgt"), NO_LIMIT)
            writer.finish({"train.src": done.src_digest, "train.tgt": done.tgt_digest})

    seconds = timed(build)
    (scratch / "tokens.safetensors").unlink()
    return seconds


def raw_chunks(corpus: Path) -> Iterator[list[str]]:
    """The texts qkv tokenizes in one call: a chunk of sources, then their targets."""
    for src, tgt in zip(
        line_chunks(corpus / "train.de"), line_chunks(corpus / "train.en"), strict=True
    ):
        yield src + tgt


def raw_seconds(tokenizer_file: Path, chunks: list[list[str]], method: str) -> float:
    """Seconds for Hugging Face `tokenizers` to encode `chunks`, one call each."""
    hf = HfTokenizer.from_file(str(tokenizer_file))
    hf.encode_special_tokens = True  # as qkv's Tokenizer sets it
    encode = getattr(hf, method)

    def run() -> None:
        for chunk in chunks:  # each call's Encodings dropped, as qkv drops its arrays
            encode(chunk, add_special_tokens=False)

    return timed(run)


_POOL_TOKENIZER: list[Tokenizer] = []


def _pool_start(tokenizer_file: str) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core a worker process
    _POOL_TOKENIZER.append(Tokenizer.load(tokenizer_file))


def _pool_encode(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    return _POOL_TOKENIZER[0].encode_flat(texts)


def pool_seconds(tokenizer_file: Path, corpus: Path, workers: int) -> float:
    """`qkv_seconds`' reading and tokenizing, the tokenizing done by a process pool."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, _pool_start, (str(tokenizer_file),)) as pool:
        pool.map(_pool_encode, [["warm up"]] * workers)
        files = ParallelFiles.counted(corpus / "train.de", corpus / "train.en")
        chunks = (src + tgt for src, tgt in files.chunks())
        return timed(lambda: sum(len(ids) for ids, _ in pool.imap(_pool_encode, chunks)))


def peak_rss(corpus: Path, run: Path, args: argparse.Namespace) -> dict[str, float]:
    """Peak RSS (MiB) and seconds of `qkv train translation` on the corpus."""
    shutil.rmtree(run, ignore_errors=True)
    command = [sys.executable, "-m", "qkv.cli", "train", "translation", "--data", str(corpus)]
    command += ["--out", str(run), "--preset", "tiny", f"max_steps={args.steps}"]
    command += [f"eval_every={args.steps}", "valid_sentences=64", "vocab_size=8000"]
    command += ["device=cpu", f"threads={args.threads}", "compile=false"]
    command += [f"tokenizer_sample={args.tokenizer_sample}"]
    env = {**os.environ, "PYTHONPATH": str(args.src)}
    start = time.perf_counter()
    with (run.parent / f"{run.name}.log").open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise SystemExit(f"training failed ({process.returncode}): see {run}.log")
    return {"peak_rss_mib": usage.ru_maxrss / 1024, "train_s": time.perf_counter() - start}


def measure(size: int, args: argparse.Namespace, tokenizer: Tokenizer) -> dict[str, Any]:
    corpus = generate(args.multi30k, size, args.workdir / f"pairs-{size}")
    row: dict[str, Any] = {"pairs": size}
    if size <= args.throughput_max:
        sentences = 2 * size
        chunks = list(raw_chunks(corpus))
        for _ in range(args.rounds):  # alternated, the best of each kept: fair under noise
            for method in ("encode_batch", "encode_batch_fast"):
                seconds = raw_seconds(args.workdir / "tokenizer.json", chunks, method)
                row[method] = max(row.get(method, 0.0), sentences / seconds)
            seconds = qkv_seconds(tokenizer, corpus, args.workdir)
            row["qkv"] = max(row.get("qkv", 0.0), sentences / seconds)
        del chunks
        if args.compare_workers:
            row.update(compare_workers(tokenizer, corpus, args))
            args.compare_workers = False  # on the first size only
    if size <= args.rss_max:
        row.update(peak_rss(corpus, args.workdir / f"run-{size}", args))
    print(json.dumps(row), flush=True)
    return row


def compare_workers(tokenizer: Tokenizer, corpus: Path, args: argparse.Namespace) -> dict:
    sentences = 2 * count_pairs(corpus)
    in_flight = streaming.IN_FLIGHT
    streaming.IN_FLIGHT = 0  # each chunk tokenized before the next is read
    try:
        no_overlap = sentences / qkv_seconds(tokenizer, corpus, args.workdir)
    finally:
        streaming.IN_FLIGHT = in_flight
    pool = sentences / pool_seconds(args.workdir / "tokenizer.json", corpus, args.threads)
    return {"qkv_no_overlap": no_overlap, f"process_pool_{args.threads}": pool}


def count_pairs(corpus: Path) -> int:
    return ParallelFiles.counted(corpus / "train.de", corpus / "train.en").lines


def table(rows: list[dict[str, Any]]) -> str:
    base = next((row["peak_rss_mib"] for row in rows if "peak_rss_mib" in row), 1.0)
    lines = [
        "| pairs | HF encode_batch | HF encode_batch_fast | qkv cache | qkv / fastest HF "
        "| peak RSS (MiB) | RSS / smallest | train run (s) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        rates = ["—"] * 4
        if "qkv" in row:
            fastest = max(row["encode_batch"], row["encode_batch_fast"])
            rates = [f"{row[k]:,.0f}" for k in ("encode_batch", "encode_batch_fast", "qkv")]
            rates.append(f"{row['qkv'] / fastest:.0%}")
        memory = ["—"] * 3
        if "peak_rss_mib" in row:
            rss = row["peak_rss_mib"]
            memory = [f"{rss:,.0f}", f"{rss / base:.2f}", f"{row['train_s']:.0f}"]
        lines.append(f"| {row['pairs']:,} | {' | '.join(rates + memory)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="500000,2000000,5000000")
    parser.add_argument("--multi30k", type=Path, default=ROOT.parent / "shared/data/multi30k")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/qkv-corpus-scale"))
    parser.add_argument("--steps", type=int, default=300, help="training steps of each run")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokenizer-sample", type=int, default=200_000)
    parser.add_argument("--throughput-max", type=int, default=2_000_000, help="larger: RSS only")
    parser.add_argument("--rss-max", type=int, default=2**62, help="larger: throughput only")
    parser.add_argument("--rounds", type=int, default=2, help="tokenization timings, best of")
    parser.add_argument("--compare-workers", action="store_true")
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the qkv trained")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    lines = [_gz_lines(args.multi30k / f"train.{lang}.gz") for lang in ("de", "en")]
    tokenizer = Tokenizer.train(lines[0] + lines[1], vocab_size=8000, min_frequency=2)
    tokenizer.save(args.workdir / "tokenizer.json")
    print(f"chunks of {CHUNK_LINES} pairs; {os.cpu_count()} CPUs", flush=True)
    rows = [measure(int(size), args, tokenizer) for size in args.sizes.split(",")]
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
