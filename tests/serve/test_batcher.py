"""The batcher: jobs gathered into calls, each job its own results, calls at most `in_flight`."""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable

import pytest

from qkv.serve.batcher import Batcher


class Recorder:
    """A `run` that holds each call until released and counts the calls running at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = self.most = 0
        self.release = threading.Event()
        self.calls: list[list[str]] = []

    def __call__(self, options: Hashable, texts: list[str]) -> list[str]:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.calls.append(texts)
        self.release.wait(timeout=10)
        with self.lock:
            self.running -= 1
        return [f"{options}:{text}" for text in texts]


@pytest.mark.parametrize("in_flight", [1, 2])
def test_calls_overlap_only_up_to_in_flight(in_flight: int) -> None:
    run = Recorder()
    batcher = Batcher(run, window=0.05, in_flight=in_flight)
    first = batcher.submit("a", ["x"], 1)
    while not run.calls:  # the first call is running, held
        time.sleep(0.01)
    later = [batcher.submit("a", [f"y{i}", f"z{i}"], 2) for i in range(3)]
    time.sleep(0.3)  # with a free slot, the later jobs start as one call meanwhile
    assert len(run.calls) == in_flight
    run.release.set()
    assert first.result(timeout=10) == ["a:x"]
    assert [job.result(timeout=10) for job in later] == [[f"a:y{i}", f"a:z{i}"] for i in range(3)]
    batcher.close()
    assert run.most == in_flight
    assert batcher.batches == 2  # the later jobs, gathered into one call either way


def test_a_failing_call_fails_its_jobs_and_the_batcher_goes_on() -> None:
    def run(options: Hashable, texts: list[str]) -> list[str]:
        if "bad" in texts:
            raise ValueError("bad text")
        return texts

    batcher = Batcher(run, window=0.0, in_flight=2)
    with pytest.raises(ValueError, match="bad text"):
        batcher.submit("a", ["bad"], 1).result(timeout=10)
    assert batcher.submit("a", ["good"], 1).result(timeout=10) == ["good"]
    batcher.close()
