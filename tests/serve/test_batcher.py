"""The batcher: jobs gathered into one call, each job its own results; a failed call fails
its own jobs only."""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable

import pytest

from qkv.serve.batcher import Batcher


def test_jobs_waiting_together_run_as_one_call_each_with_its_results() -> None:
    release, calls = threading.Event(), []

    def run(options: Hashable, texts: list[str]) -> list[str]:
        calls.append(texts)
        release.wait(timeout=10)
        return [f"{options}:{text}" for text in texts]

    batcher = Batcher(run, window=0.05)
    first = batcher.submit("a", ["x"], 1)
    while not calls:  # the first call is running, held
        time.sleep(0.01)
    later = [batcher.submit("a", [f"y{i}", f"z{i}"], 2) for i in range(3)]  # they wait together
    release.set()
    assert first.result(timeout=10) == ["a:x"]
    assert [job.result(timeout=10) for job in later] == [[f"a:y{i}", f"a:z{i}"] for i in range(3)]
    batcher.close()
    assert calls == [["x"], ["y0", "z0", "y1", "z1", "y2", "z2"]]
    assert batcher.batches == 2


def test_a_failing_call_fails_its_jobs_and_the_batcher_goes_on() -> None:
    def run(options: Hashable, texts: list[str]) -> list[str]:
        if "bad" in texts:
            raise ValueError("bad text")
        return texts

    batcher = Batcher(run, window=0.0)
    with pytest.raises(ValueError, match="bad text"):
        batcher.submit("a", ["bad"], 1).result(timeout=10)
    assert batcher.submit("a", ["good"], 1).result(timeout=10) == ["good"]
    batcher.close()


def test_with_two_workers_a_batch_gathers_and_runs_while_another_runs() -> None:
    release, calls = threading.Event(), []

    def run(options: Hashable, texts: list[str]) -> list[str]:
        calls.append(texts)
        if texts == ["x"]:
            release.wait(timeout=10)  # the first call holds its worker
        return [f"{options}:{text}" for text in texts]

    batcher = Batcher(run, window=0.05, workers=2)
    first = batcher.submit("a", ["x"], 1)
    while not calls:
        time.sleep(0.01)
    later = [batcher.submit("a", [f"y{i}"], 1) for i in range(3)]
    # gathered and run by the other worker while the first call is still held
    assert [job.result(timeout=10) for job in later] == [[f"a:y{i}"] for i in range(3)]
    assert not first.done()
    release.set()
    assert first.result(timeout=10) == ["a:x"]
    other = batcher.submit("b", ["w"], 1)  # every job submitted before close() is finished
    batcher.close()
    assert other.result(timeout=0) == ["b:w"]
    assert calls == [["x"], ["y0", "y1", "y2"], ["w"]]
    assert batcher.batches == 3
    assert not any(thread.is_alive() for thread in batcher.threads)
