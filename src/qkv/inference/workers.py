"""Decoding on a CPU in several processes of one thread each: `map_in_workers(job, n, workers)`.

A decoding step multiplies small matrices (64 rows by 256 columns for a batch of 64) and runs
dozens of small operations. Two threads on one such step wait for each other at every
operation. Two processes, each decoding its own batches on one thread, do not. On a 2-core
machine that gives 1.24-1.46x the sentences per second greedy and 1.05-1.13x with beam-5 over
three benchmark runs, the workers' start included (`benchmarks/README.md`). Translators built
for CPUs work this way: CTranslate2's `inter_threads` is the same split.

The workers are forked, so they start in milliseconds and share the parent's model, whose
weights are read and never written, so the pages stay shared. A forked child cannot use the
parent's OpenMP thread pool, so each worker runs torch on one thread, which is the point here.
Only batches' indices go to the workers and only plain results come back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import multiprocessing
import os
import signal
import threading
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

import torch

from qkv.errors import ConfigError, QkvError

Result = TypeVar("Result")

PR_SET_PDEATHSIG = 1
"""prctl's option that names the signal a process gets when its parent dies (Linux)."""

_JOB: Callable[[int], Any] | None = None
"""The job of the pool being started; forked workers inherit it, so it is never pickled."""


def check_workers(workers: int, device: torch.device) -> None:
    """Raise ConfigError when `workers` > 1 processes cannot decode on `device`; warn when
    they are more than the CPUs."""
    if workers > 1 and device.type != "cpu":
        raise ConfigError(
            f"workers > 1 decode on a CPU only; this model is on {device.type} "
            "(--device cpu, or Translator.load(run, device='cpu'))"
        )
    if workers > 1 and "fork" not in multiprocessing.get_all_start_methods():
        raise ConfigError("workers > 1 need processes started by fork, which this system lacks")
    if workers > (cpus := usable_cpus()):
        warnings.warn(
            f"{workers} workers on {cpus} CPU{'s' if cpus > 1 else ''}: the extra ones only "
            f"take turns and hold memory; {cpus} is the most that helps",
            stacklevel=2,
        )


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def map_in_workers(job: Callable[[int], Result], count: int, workers: int) -> Iterator[Result]:
    """`job(0), ..., job(count - 1)`, yielded in order, computed by `workers` processes.

    With one worker (or one job) everything runs here, on torch's threads. Otherwise each
    worker takes the next index when it is free, so long and short jobs even out. A job's
    exception is raised here; a worker that dies (killed, out of memory) raises QkvError.
    On KeyboardInterrupt or SIGTERM here, the workers are stopped at once (SIGTERM is raised
    as KeyboardInterrupt while the workers run); a worker whose parent dies, even by SIGKILL,
    is ended by the kernel (Linux).
    """
    if workers <= 1 or count <= 1:
        yield from map(job, range(count))
        return
    global _JOB
    _JOB = job
    others = set(multiprocessing.active_children())
    pool = ProcessPoolExecutor(
        min(workers, count), mp_context=multiprocessing.get_context("fork"), initializer=_start
    )
    previous = _raise_on_sigterm()
    try:
        with warnings.catch_warnings():
            # Python >= 3.12 warns at fork when the process has threads (here OpenMP's idle
            # pool). Workers never touch that pool: they run torch on one thread of their own.
            warnings.filterwarnings(
                "ignore", "This process .* is multi-threaded", DeprecationWarning
            )
            results = pool.map(_run, range(count))
        yield from results
    except BrokenProcessPool as error:
        raise QkvError("a decoding worker process died (killed, or out of memory?)") from error
    except KeyboardInterrupt:  # stop now, not after the batches under way
        for process in set(multiprocessing.active_children()) - others:
            process.terminate()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        _JOB = None
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _raise_on_sigterm() -> Any:
    """Handle SIGTERM as Ctrl-C until restored (main thread only); the previous handler."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, interrupt)


def _start() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _end_with_parent()
    torch.set_num_threads(1)


def _end_with_parent() -> None:
    """Ask Linux to send this process SIGTERM when its parent dies (prctl PR_SET_PDEATHSIG)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    except (OSError, AttributeError):  # not Linux: a parent killed outright leaves its workers
        pass


def _run(index: int) -> Any:
    if _JOB is None:  # only a pool started by map_in_workers runs this
        raise RuntimeError("no job: workers must be forked by map_in_workers")
    return _JOB(index)
