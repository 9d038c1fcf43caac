"""Picking the device a run or a model loaded from one works on, and a run's process settings."""

from __future__ import annotations

import platform

import pytest
import torch

from qkv.errors import ConfigError
from qkv.fast.compiled import allowed
from qkv.training.config import TrainConfig
from qkv.training.speed import pick_device, set_up_process, tune_allocator


def test_auto_and_cpu() -> None:
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert pick_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("tpu", "unknown device 'tpu'"),
        ("meta", "device=meta is not one qkv runs on"),
        (None, "device must be auto, cpu, cuda or cuda:N, got None"),
    ],
)
def test_devices_qkv_does_not_run_on_are_refused(name: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        pick_device(name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_cuda_without_a_gpu_says_what_to_use() -> None:
    with pytest.raises(ConfigError, match=r"torch sees no CUDA device .*: use auto or cpu"):
        pick_device("cuda:0")


def test_a_gpu_beyond_those_torch_sees_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert pick_device("cuda:1") == torch.device("cuda:1")
    assert pick_device("cuda") == torch.device("cuda")
    with pytest.raises(ConfigError, match=r"device=cuda:2, but torch sees 2 CUDA device\(s\)"):
        pick_device("cuda:2")


def test_set_up_process_applies_a_runs_threads_compiling_and_determinism() -> None:
    threads = torch.get_num_threads()
    try:
        set_up_process(TrainConfig(threads=1, compile=False, deterministic=True))
        assert torch.get_num_threads() == 1
        assert not allowed()
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        set_up_process(TrainConfig(threads=threads))
    assert torch.get_num_threads() == threads and allowed()
    assert not torch.are_deterministic_algorithms_enabled()


def test_the_allocator_is_tuned_where_glibc_is() -> None:
    # Every setting (kept blocks, one arena) applied with glibc; elsewhere False, no error.
    assert tune_allocator() is (platform.libc_ver()[0] == "glibc")


def test_without_a_c_library_the_allocator_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback where glibc's `mallopt` cannot be reached through ctypes."""
    from qkv.training import speed

    monkeypatch.setattr(speed.ctypes.util, "find_library", lambda name: None)
    assert tune_allocator() is False


@pytest.mark.parametrize("setting", ["MALLOC_ARENA_MAX", "GLIBC_TUNABLES"])
def test_the_users_own_allocator_settings_are_left_alone(
    monkeypatch: pytest.MonkeyPatch, setting: str
) -> None:
    monkeypatch.setenv(setting, "4" if setting.startswith("MALLOC") else "glibc.malloc.arena_max=4")
    assert tune_allocator() is False
