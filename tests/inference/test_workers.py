"""Decoding in forked worker processes: order, errors, one thread each, same output."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import warnings

import pytest
import torch

from qkv.errors import ConfigError, QkvError
from qkv.inference import workers as workers_module
from qkv.inference.translate import DecodeOptions, translate_ids
from qkv.inference.workers import check_workers, map_in_workers
from qkv.model.seq2seq import Seq2SeqTransformer
from tests.model.helpers import tiny_config


def where(index: int) -> tuple[int, int, int]:
    return index, os.getpid(), torch.get_num_threads()


def test_results_come_in_order_from_worker_processes_of_one_thread() -> None:
    found = list(map_in_workers(where, 7, workers=2))
    assert [index for index, _, _ in found] == list(range(7))
    pids = {pid for _, pid, _ in found}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    assert {threads for _, _, threads in found} == {1}


def test_one_worker_or_one_job_runs_here() -> None:
    for count, workers in ((3, 1), (1, 4), (0, 2)):
        found = list(map_in_workers(where, count, workers))
        assert [index for index, _, _ in found] == list(range(count))
        assert {pid for _, pid, _ in found} <= {os.getpid()}


def fail_on_two(index: int) -> int:
    if index == 2:
        raise ValueError(f"job {index} failed")
    return index


def die_on_one(index: int) -> int:
    if index == 1:
        os._exit(3)
    return index


def test_a_jobs_error_is_raised_here() -> None:
    with pytest.raises(ValueError, match="job 2 failed"):
        list(map_in_workers(fail_on_two, 4, workers=2))
    assert workers_module._JOB is None


def test_a_dead_worker_is_a_clear_error() -> None:
    with pytest.raises(QkvError, match="worker process died"):
        list(map_in_workers(die_on_one, 4, workers=2))


def test_workers_need_a_cpu_and_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    check_workers(1, torch.device("cuda"))
    check_workers(2, torch.device("cpu"))
    with pytest.raises(ConfigError, match=r"on a CPU only; this model is on cuda \(--device cpu"):
        check_workers(2, torch.device("cuda"))
    monkeypatch.setattr(workers_module.multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    with pytest.raises(ConfigError, match="started by fork"):
        check_workers(2, torch.device("cpu"))


def test_more_workers_than_cpus_is_warned_about(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers_module, "usable_cpus", lambda: 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_workers(2, torch.device("cpu"))  # one per CPU: nothing to say
    with pytest.warns(UserWarning, match="^64 workers on 2 CPUs: .* 2 is the most that helps$"):
        check_workers(64, torch.device("cpu"))
    monkeypatch.undo()
    assert workers_module.usable_cpus() >= 1


@pytest.mark.filterwarnings("ignore:.* workers on .* CPU")  # more workers than CPUs, on purpose
@pytest.mark.parametrize(
    "fields", [{}, {"beam_size": 3}, {"sampling": True, "top_k": 5, "seed": 7}], ids=str
)
def test_translation_does_not_depend_on_the_number_of_workers(fields: dict[str, int]) -> None:
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(vocab_size=60, max_len=40))
    generator = torch.Generator().manual_seed(1)
    sources = [
        torch.randint(4, 60, (int(n),), generator=generator).tolist()
        for n in torch.randint(1, 12, (23,), generator=generator)
    ]
    sources[5] = []
    options = [DecodeOptions(max_len_b=6, max_tokens=30, workers=w, **fields) for w in (1, 2, 3)]
    cpu = torch.device("cpu")
    one, two, three = (translate_ids(model, sources, o, cpu) for o in options)
    assert one == two == three
    assert one[5] == [] and sum(map(len, one)) > 0


def sleep_long(index: int) -> int:
    time.sleep(60)
    return index


def test_an_interrupt_stops_the_workers_at_once() -> None:
    before = set(multiprocessing.active_children())
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            list(map_in_workers(sleep_long, 4, workers=2))
    finally:
        timer.cancel()
    assert time.monotonic() - start < 30  # not the 60 s of the batches under way
    assert set(multiprocessing.active_children()) <= before
    assert workers_module._JOB is None


WORKERS_SCRIPT = """
import os, sys, time
from qkv.inference.workers import map_in_workers

def job(index):
    os.write(1, b"%d\\n" % os.getpid())  # one write: the two workers' lines never interleave
    time.sleep(60)
    return index

try:
    list(map_in_workers(job, 4, workers=2))
except KeyboardInterrupt:
    sys.exit(130)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc to see the workers")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_workers_end_when_their_parent_is_terminated_or_killed(signum: signal.Signals) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", WORKERS_SCRIPT], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    pids = [int(parent.stdout.readline()) for _ in range(2)]  # both workers are under way
    parent.send_signal(signum)
    assert parent.wait(timeout=30) == (130 if signum == signal.SIGTERM else -signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids)
