"""Requests that arrive together decode together: a gathering window and a token budget.

Each served model has one `Batcher`, a thread that takes the first waiting job, gathers for
`window` seconds more the jobs that share its decoding options (up to `max_tokens` source
tokens), runs them as one call, and hands each job its own slice of the results, in order.
A job with other options waits for the next round. With more `workers` (for an engine that
decodes calls side by side), one thread gathers while the others run their batches.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

Run = Callable[[Hashable, list[str]], Sequence[Any]]
"""`run(options, texts)` -> one result a text."""


@dataclass
class Job:
    options: Hashable
    texts: list[str]
    tokens: int  # its share of the batch's token budget
    future: Future[list[Any]] = field(default_factory=Future)


class Batcher:
    """`workers` threads running `run` over gathered jobs."""

    def __init__(
        self, run: Run, window: float = 0.01, max_tokens: int = 8192, workers: int = 1
    ) -> None:
        self.run, self.window, self.max_tokens = run, window, max_tokens
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.waiting: list[Job] = []  # taken from the queue, with other options than a batch's
        self.gathering = threading.Lock()  # one thread gathers at a time; the others run
        self.batches = 0  # calls of `run` so far
        self.counting = threading.Lock()
        self.threads = [
            threading.Thread(target=self._loop, name=f"qkv-batcher-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self.threads:
            thread.start()

    def submit(self, options: Hashable, texts: list[str], tokens: int) -> Future[list[Any]]:
        job = Job(options, texts, tokens)
        self.jobs.put(job)
        return job.future

    def close(self) -> None:
        """Finish every job submitted so far, then stop the threads."""
        for _ in self.threads:
            self.jobs.put(None)
        for thread in self.threads:
            thread.join()

    def _loop(self) -> None:
        closing = False
        while True:
            with self.gathering:
                if closing and not self.waiting:
                    return
                first = self.waiting.pop(0) if self.waiting else self.jobs.get()
                if first is None:
                    closing = True
                    continue
                batch, closing = self._gather(first, closing)
            self._run(batch)

    def _gather(self, first: Job, closing: bool) -> tuple[list[Job], bool]:
        """`first` and the jobs with its options that fit the budget, from those waiting and
        those arriving within the window."""
        batch, tokens = [first], first.tokens
        for job in list(self.waiting):
            if job.options == first.options and tokens + job.tokens <= self.max_tokens:
                self.waiting.remove(job)
                batch.append(job)
                tokens += job.tokens
        deadline = time.monotonic() + self.window
        while not closing and tokens < self.max_tokens:
            try:
                arrived = self.jobs.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                break
            if arrived is None:
                closing = True
            elif arrived.options == first.options and tokens + arrived.tokens <= self.max_tokens:
                batch.append(arrived)
                tokens += arrived.tokens
            else:
                self.waiting.append(arrived)
        return batch, closing

    def _run(self, batch: list[Job]) -> None:
        texts = [text for job in batch for text in job.texts]
        try:
            results = list(self.run(batch[0].options, texts))
        except Exception as error:  # every waiting client hears of it
            for job in batch:
                job.future.set_exception(error)
            return
        with self.counting:
            self.batches += 1
        start = 0
        for job in batch:
            job.future.set_result(results[start : start + len(job.texts)])
            start += len(job.texts)
