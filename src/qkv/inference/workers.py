"""Decoding batches side by side on a CPU, each thread on its own torch thread (CTranslate2's
`inter_threads`): torch threads sharing a step's small operations wait at every one."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

from qkv.errors import ConfigError
from qkv.training.signals import sigterm_as_ctrl_c

Result = TypeVar("Result")

AUTO_MOST = 4  # the most workers `workers=0` chooses: each takes Python's lock at every call


def check_workers(workers: int, device: torch.device) -> None:
    """Raise ConfigError when `workers` > 1 threads cannot decode on `device`; warn when they
    are more than the CPUs."""
    if workers > 1 and device.type != "cpu":
        raise ConfigError(
            f"workers > 1 decode on a CPU only; this model is on {device.type} "
            "(--device cpu, or Translator.load(run, device='cpu'))"
        )
    if workers > (cpus := usable_cpus()):
        warnings.warn(
            f"{workers} workers on {cpus} CPU{'s' if cpus > 1 else ''}: the extra ones only "
            f"take turns and hold memory; {cpus} is the most that helps",
            stacklevel=2,
        )


def auto_workers(workers: int, device: torch.device, width: int = 1) -> int:
    """How many workers decode: `workers` when given (> 0); for 0 (auto), one per torch thread
    of the caller, at most AUTO_MOST, for greedy search and sampling on a CPU, else one (a
    beam's `width` multiplies the memory of every batch in flight, for little gain)."""
    if workers > 0:
        return workers
    if device.type != "cpu" or width > 1:
        return 1
    return max(1, min(torch.get_num_threads(), usable_cpus(), AUTO_MOST))


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def map_in_workers(job: Callable[[int], Result], count: int, workers: int) -> Iterator[Result]:
    """`job(0), ..., job(count - 1)`, yielded in order, computed by `workers` threads, each on
    its share of the caller's torch threads (the last `count % workers` jobs run here on all).
    A job's exception, KeyboardInterrupt, and SIGTERM while the workers run (main thread only)
    are raised here once the jobs under way end."""
    workers = min(workers, count)
    if workers <= 1:
        yield from map(job, range(count))
        return
    threads = torch.get_num_threads()
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

    def in_mode(index: int) -> Result:
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            return job(index)

    split = count - count % workers
    pool = ThreadPoolExecutor(
        workers,
        "qkv-decode",
        initializer=torch.set_num_threads,
        initargs=(max(1, threads // workers),),
    )
    try:
        with sigterm_as_ctrl_c():  # stops as Ctrl-C does, once the jobs under way end
            yield from pool.map(in_mode, range(split))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        torch.set_num_threads(threads)  # torch keeps the last count set as its default
    yield from map(job, range(split, count))
