"""Process-level settings that make CPU training faster without changing any result."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

import torch
import torch.distributed as dist

from qkv.errors import ConfigError
from qkv.fast.compiled import allow
from qkv.training.config import TrainConfig
from qkv.training.distributed import launched

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
_MALLOPT_SETTINGS = ((_M_MMAP_THRESHOLD, 1 << 30), (_M_TRIM_THRESHOLD, 1 << 31), (_M_ARENA_MAX, 1))


def tune_allocator() -> bool:
    """Ask glibc to keep freed large blocks (activations, freed every step) instead of mapping
    and unmapping them each time, in one arena for all threads so that decoding's worker
    threads hold no memory apart; returns whether it applied (glibc only, and not over
    settings of the user's own: `MALLOC_*` or `GLIBC_TUNABLES` in the environment)."""
    name = ctypes.util.find_library("c")
    own = "GLIBC_TUNABLES" in os.environ or any(key.startswith("MALLOC_") for key in os.environ)
    if name is None or os.name != "posix" or own:
        return False
    try:
        libc = ctypes.CDLL(name)
        accepted = [libc.mallopt(option, value) for option, value in _MALLOPT_SETTINGS]
    except (OSError, AttributeError):
        return False
    return all(accepted)


def set_up_process(config: TrainConfig) -> None:
    """A training run's process-wide settings: torch's threads, glibc's allocator, compiled
    loops on or off (`compile`) and deterministic algorithms (`deterministic`)."""
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    tune_allocator()
    allow(config.compile)
    torch.use_deterministic_algorithms(config.deterministic)


def pick_device(name: str | torch.device) -> torch.device:
    """The device named: "auto" means CUDA when available, else the CPU. Under torchrun, each
    rank on a machine takes its own GPU, cuda:LOCAL_RANK."""
    if isinstance(name, torch.device):  # as torch takes it
        name = str(name)
    if not isinstance(name, str):
        raise ConfigError(f"device must be auto, cpu, cuda or cuda:N, got {name!r}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and launched() and torch.cuda.is_available():
        name = f"cuda:{dist.get_node_local_rank(fallback_rank=0)}"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"device {name} asked for, but torch sees no CUDA device (no GPU, or a CPU-only "
            "torch): use auto or cpu"
        )
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device {name!r}: use auto, cpu or cuda") from None
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"device={name} is not one qkv runs on: use auto, cpu or cuda")
    if device.type == "cuda" and device.index is not None:
        count = torch.cuda.device_count()
        if device.index >= count:
            raise ConfigError(
                f"device={name}, but torch sees {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
            )
    return device
