"""Small functions compiled by `torch.compile` (inductor), where eager torch is slow on the CPU.

Where torch.compile cannot work (no C++ compiler, for one), `compiled` warns once and the caller
keeps its eager way, as it does while `allow(False)` (the training config's `compile=false`).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import torch

_allowed = [True]


def allow(flag: bool) -> None:
    """Let callers use their compiled functions (the default), or not."""
    _allowed[0] = flag


def allowed() -> bool:
    """Whether callers may use their compiled functions (`allow`)."""
    return _allowed[0]


def compiled(fn: Callable[..., Any], *example: Any) -> Callable[..., Any] | None:
    """`fn` compiled for any input sizes, tried once on `example`; None where that fails.

    The example's sizes should be distinct, above 1 and as large as the real work; its tensors
    distinct objects, not drawn from torch's global generator (which compiling leaves alone).
    The function returned runs `fn` with autograd off and its tensors detached.
    """
    kernel = torch.compile(fn, dynamic=True)
    logger = logging.getLogger("torch.utils.cpp_extension")

    def run(*args: Any) -> Any:
        with torch.no_grad():
            args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
            return kernel(*args)

    try:
        # A CUDA build of torch without a GPU logs "No CUDA runtime is found" when inductor
        # first builds C++; the loops here are the CPU's, so that one note is dropped.
        logger.addFilter(_no_cuda_note)
        with torch.random.fork_rng(devices=[]):  # compiling draws nothing from the run's RNG
            run(*example)
    except Exception as error:  # inductor could not build or run its kernel here
        text = str(error).strip()
        reason = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
        warnings.warn(
            f"qkv: {fn.__name__} is not compiled ({reason}); the eager way is used",
            stacklevel=2,
        )
        return None
    finally:
        logger.removeFilter(_no_cuda_note)
    return run


def _no_cuda_note(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("No CUDA runtime is found")
