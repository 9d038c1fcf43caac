"""Decoding in worker threads: order, errors, threads each, modes, same output."""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings

import pytest
import torch

from qkv.errors import ConfigError
from qkv.inference import workers as workers_module
from qkv.inference.translate import DecodeOptions, translate_ids
from qkv.inference.workers import AUTO_MOST, auto_workers, check_workers, map_in_workers
from qkv.model.seq2seq import Seq2SeqTransformer
from tests.model.helpers import tiny_config

CPU = torch.device("cpu")


def where(index: int) -> tuple[int, str, int]:
    return index, threading.current_thread().name, torch.get_num_threads()


@pytest.fixture
def four_threads() -> object:
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("four_threads")
def test_results_come_in_order_from_worker_threads_sharing_the_callers_threads() -> None:
    found = list(map_in_workers(where, 7, workers=2))
    assert [index for index, _, _ in found] == list(range(7))
    here = threading.current_thread().name
    # Jobs 0-5 in the two workers on 2 torch threads each, the seventh here on all 4.
    assert {(name != here, threads) for _, name, threads in found[:6]} == {(True, 2)}
    assert 1 <= len({name for _, name, _ in found[:6]}) <= 2
    assert found[6][1:] == (here, 4)
    assert torch.get_num_threads() == 4  # the caller's count is left as it was


def test_one_worker_or_one_job_runs_here() -> None:
    here = threading.current_thread().name
    for count, workers in ((3, 1), (1, 4), (0, 2)):
        found = list(map_in_workers(where, count, workers))
        assert [index for index, _, _ in found] == list(range(count))
        assert {name for _, name, _ in found} <= {here}


def test_jobs_run_under_the_callers_grad_and_inference_modes() -> None:
    def modes(index: int) -> tuple[bool, bool]:
        return torch.is_grad_enabled(), torch.is_inference_mode_enabled()

    assert set(map_in_workers(modes, 4, workers=2)) == {(True, False)}
    with torch.no_grad():
        assert set(map_in_workers(modes, 4, workers=2)) == {(False, False)}
    with torch.inference_mode():
        assert set(map_in_workers(modes, 4, workers=2)) == {(False, True)}


def test_a_jobs_error_is_raised_here_and_no_new_job_starts() -> None:
    started = []

    def fail_on_one(index: int) -> int:
        started.append(index)
        if index == 1:
            raise ValueError(f"job {index} failed")
        time.sleep(0.05)
        return index

    with pytest.raises(ValueError, match="job 1 failed"):
        list(map_in_workers(fail_on_one, 40, workers=2))
    assert len(started) < 40


def test_workers_need_a_cpu() -> None:
    check_workers(0, torch.device("cuda"))
    check_workers(1, torch.device("cuda"))
    check_workers(2, CPU)
    with pytest.raises(ConfigError, match=r"on a CPU only; this model is on cuda \(--device cpu"):
        check_workers(2, torch.device("cuda"))


def test_auto_is_one_worker_per_torch_thread_for_one_path_on_a_cpu_and_one_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workers_module, "usable_cpus", lambda: 64)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert auto_workers(0, CPU) == 2
    assert auto_workers(0, CPU, width=5) == 1  # beam search
    assert auto_workers(0, torch.device("cuda")) == 1
    assert auto_workers(3, CPU, width=5) == 3  # given: as given
    monkeypatch.setattr(torch, "get_num_threads", lambda: 64)
    assert auto_workers(0, CPU) == AUTO_MOST
    monkeypatch.setattr(workers_module, "usable_cpus", lambda: 1)
    assert auto_workers(0, CPU) == 1


def test_more_workers_than_cpus_is_warned_about(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers_module, "usable_cpus", lambda: 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_workers(2, CPU)  # one per CPU: nothing to say
    with pytest.warns(UserWarning, match="^64 workers on 2 CPUs: .* 2 is the most that helps$"):
        check_workers(64, CPU)
    monkeypatch.undo()
    assert workers_module.usable_cpus() >= 1


@pytest.fixture
def one_torch_thread() -> object:
    """Tiny models decode fastest on one thread; each worker gets one too."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("one_torch_thread")
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
        for n in torch.randint(1, 12, (14,), generator=generator)
    ]
    sources[5] = []
    options = [
        DecodeOptions(max_len_a=1.0, max_len_b=4, max_tokens=30, workers=w, **fields)
        for w in (1, 2, 3, 0)
    ]
    one, two, three, auto = (translate_ids(model, sources, o, CPU) for o in options)
    assert one == two == three == auto
    assert one[5] == [] and sum(map(len, one)) > 0


def test_an_interrupt_starts_no_new_job() -> None:
    started = []

    def sleep_a_little(index: int) -> int:
        started.append(index)
        time.sleep(0.5)
        return index

    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            list(map_in_workers(sleep_a_little, 40, workers=2))
    finally:
        timer.cancel()
    assert sorted(started) == [0, 1]  # the two under way ended, none started after
    assert time.monotonic() - start < 5  # not the 10 s of the other 38


def test_sigterm_while_the_workers_run_is_an_interrupt() -> None:
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM))
    previous = signal.getsignal(signal.SIGTERM)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            list(map_in_workers(lambda index: time.sleep(0.5), 40, workers=2))
    finally:
        timer.cancel()
    assert signal.getsignal(signal.SIGTERM) == previous
