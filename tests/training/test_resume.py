"""`qkv train --resume` continues exactly: runs killed and resumed end with the same weights.

Every run is a real `python -m qkv.cli train translation` process on a generated corpus, in
deterministic CPU mode with one thread; the test watches metrics.jsonl (one train record per step)
and signals the process once it has passed a given step.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

MAX_STEPS = 20
WORDS = {
    "de": ["ein", "zwei", "drei", "mann", "frau", "hund", "katze", "haus", "rot", "blau"],
    "en": ["one", "two", "three", "man", "woman", "dog", "cat", "house", "red", "blue"],
}
TINY_RUN = [
    "--preset",
    "tiny",
    "vocab_size=200",
    "min_frequency=1",
    "max_tokens=256",
    "warmup=10",
    "log_every=1",
    "threads=1",
    "deterministic=true",
    "device=cpu",
    "seed=3",
]
"""A tiny deterministic translation run on `write_corpus`'s pairs (also the distributed tests')."""
SETTINGS = [*TINY_RUN, f"max_steps={MAX_STEPS}", "eval_every=5", "keep_checkpoints=100"]
TIMEOUT = 600.0  # generous: the machine may be busy


def write_corpus(directory: Path) -> Path:
    """200 training and 8 validation pairs of word-by-word translations."""
    rng = random.Random(0)
    directory.mkdir()
    for split, n in (("train", 200), ("val", 8)):
        pairs = []
        for _ in range(n):
            idx = [rng.randrange(len(WORDS["de"])) for _ in range(rng.randint(3, 8))]
            pairs.append([" ".join(WORDS[lang][i] for i in idx) for lang in ("de", "en")])
        for k, lang in enumerate(("de", "en")):
            text = "".join(pair[k] + "\n" for pair in pairs)
            (directory / f"{split}.{lang}").write_text(text, encoding="utf-8")
    return directory


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "qkv.cli", *args],
            stdout=out,
            stderr=subprocess.PIPE,
            env=env,
        )


def last_step(run: Path) -> int:
    try:
        lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return 0
    steps = [0]
    for line in lines:
        try:
            steps.append(json.loads(line)["step"])
        except (ValueError, KeyError):
            continue  # a line being written
    return max(steps)


def run_to_end(args: list[str], log: Path) -> str:
    proc = start(args, log)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err.decode()
    return err.decode()


def signal_after(args: list[str], run: Path, step: int, signum: signal.Signals) -> tuple[int, str]:
    """Start a run, send `signum` once it has logged `step`; its exit code and stderr."""
    proc = start(args, run.parent / f"{run.name}.log")
    deadline = time.monotonic() + TIMEOUT
    while proc.poll() is None and last_step(run) < step:
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"run did not reach step {step} in {TIMEOUT} s")
        time.sleep(0.01)
    if proc.poll() is not None:
        pytest.fail(f"run ended before step {step}: {proc.communicate()[1].decode()}")
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, err.decode()


def final_weights(run: Path) -> dict[str, dict[str, torch.Tensor]]:
    return {
        "final checkpoint": load_file(
            run / "checkpoints" / f"step-{MAX_STEPS:07d}" / "model.safetensors"
        ),
        "best model": load_file(run / "model.safetensors"),
    }


def validations(run: Path) -> list[tuple[int, float, float]]:
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"], r["bleu"]) for r in records if r["split"] == "valid"]


def assert_same_run(run: Path, reference: Path) -> None:
    found, expected = final_weights(run), final_weights(reference)
    for kind in expected:
        assert found[kind].keys() == expected[kind].keys()
        for name, tensor in expected[kind].items():
            torch.testing.assert_close(
                found[kind][name], tensor, rtol=0, atol=0, msg=f"{kind} {name}"
            )
    assert validations(run) == validations(reference)


class Reference:
    """An uninterrupted run, started in the background and awaited when first compared with."""

    def __init__(self, corpus: Path) -> None:
        self.run = corpus.parent / "reference"
        args = ["train", "translation", "--data", str(corpus), "--out", str(self.run), *SETTINGS]
        self.proc = start(args, corpus.parent / "reference.log")

    def result(self) -> Path:
        if self.proc.returncode is None:
            _, err = self.proc.communicate(timeout=TIMEOUT)
            assert self.proc.returncode == 0, err.decode()
        return self.run


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("resume") / "data")


@pytest.fixture(scope="module")
def reference(corpus: Path) -> Iterator[Reference]:
    reference = Reference(corpus)
    yield reference
    if reference.proc.poll() is None:
        reference.proc.kill()
        reference.proc.communicate()


def check_interrupted(code: int, err: str, signum: signal.Signals, run: Path) -> None:
    """Exit 130 and one line on stderr saying where the checkpoint is and how to continue."""
    assert code == 130, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"qkv: {signum.name} received: checkpoint saved at step ")
    assert lines[0].endswith(f"; continue with: qkv train --resume {run}")
    step = int(lines[0].split("checkpoint saved at step ")[1].split(";")[0])
    assert (run / "checkpoints" / f"step-{step:07d}" / "state.json").is_file()


def test_killed_and_resumed_run_matches_the_uninterrupted_one(
    corpus: Path, reference: Reference
) -> None:
    run = corpus.parent / "killed"
    fresh = ["train", "translation", "--data", str(corpus), "--out", str(run), *SETTINGS]
    resume = ["train", "--resume", str(run)]
    plan = [
        (fresh, 2, signal.SIGKILL),  # before the first checkpoint (step 5): resume starts over
        (resume, 8, signal.SIGINT),  # saves a checkpoint between two validations
        (resume, 14, signal.SIGKILL),  # after resuming from that one
    ]
    for args, step, signum in plan:
        code, err = signal_after(args, run, step, signum)
        if signum == signal.SIGKILL:
            assert code == -signal.SIGKILL, err
        else:
            check_interrupted(code, err, signum, run)
    run_to_end(resume, corpus.parent / "killed.log")
    assert_same_run(run, reference.result())


@pytest.mark.slow
def test_sigterm_then_resume_matches(corpus: Path, reference: Reference) -> None:
    run = corpus.parent / "terminated"
    args = ["train", "translation", "--data", str(corpus), "--out", str(run), *SETTINGS]
    code, err = signal_after(args, run, 12, signal.SIGTERM)
    check_interrupted(code, err, signal.SIGTERM, run)
    run_to_end(["train", "--resume", str(run)], corpus.parent / "terminated.log")
    assert_same_run(run, reference.result())


@pytest.mark.slow
def test_sigkill_after_random_delays_then_resume_matches(
    corpus: Path, reference: Reference
) -> None:
    """Each run is killed a random 0-1.5 s after it first passes the furthest step seen yet."""
    run = corpus.parent / "random"
    fresh = ["train", "translation", "--data", str(corpus), "--out", str(run), *SETTINGS]
    rng = random.Random(1)
    for _ in range(MAX_STEPS + 1):
        if any((run / "checkpoints").glob("step-???????")):
            args = ["train", "--resume", str(run)]
        else:  # nothing to resume yet: start again, as a user would
            shutil.rmtree(run, ignore_errors=True)
            args = fresh
        furthest = last_step(run)
        proc = start(args, corpus.parent / "random.log")
        deadline = time.monotonic() + TIMEOUT
        while proc.poll() is None and last_step(run) <= furthest and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            _, err = proc.communicate(timeout=rng.uniform(0.0, 1.5))
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if proc.returncode != -signal.SIGKILL:
            break
    assert proc.returncode == 0, err.decode()
    assert_same_run(run, reference.result())
