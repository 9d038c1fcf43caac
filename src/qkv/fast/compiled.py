"""Small functions compiled by `torch.compile` (inductor), where eager torch is slow on the CPU.

Some passes over memory run faster as one generated C++ loop than as several eager operations:
dropout with its masks hashed in the loop (`qkv.fast.dropout`) and the label-smoothed loss
(`qkv.fast.fused_loss`) of a CPU training step. Such a function is compiled once per
process, for inputs of any size (dynamic shapes), and first run on an example. Where
torch.compile cannot work here (no C++ compiler, for one), `compiled` warns once and the caller
keeps its eager way, as it does while `allow(False)` (the training config's `compile=false`).

Each call goes through the wrapper `torch.compile` returns, so dynamo's own guards pick the
compiled version that fits the inputs (or compile one), and the compiled code is dynamo's alone.

A CUDA build of torch (PyPI's on Linux) on a machine with a CUDA toolkit but no GPU logs "No CUDA
runtime is found" when inductor first builds C++: its builder imports `torch.utils.cpp_extension`,
which looks for the toolkit once, at import. The loops here are the CPU's, so that one note is
dropped while an example compiles (`_no_cuda_note`); whatever else torch logs is left alone.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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

    The example's sizes should be distinct and above 1 (inductor specialises sizes 0 and 1,
    and takes equal sizes for the same size until told otherwise), and as large as the work
    it stands for: inductor decides from them whether to spread a loop over the cores. Its
    tensors should be distinct objects, as the caller's will be (one tensor passed twice is
    compiled for that aliasing, and the first real call compiles again).

    The callers are the forward and backward functions of `torch.autograd.Function`s: the
    function returned runs `fn` with autograd off and its tensors detached, the example's
    too, since a change of grad mode or of a tensor's `requires_grad` compiles again. `fn`
    takes positional arguments only.

    A resumed training run restores the random state of the run it continues and compiles
    again at its first step: the example must not be drawn from torch's global generator, and
    compiling it leaves that generator as it was.
    """
    kernel = torch.compile(fn, dynamic=True)

    def run(*args: Any) -> Any:
        with torch.no_grad():
            args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
            return kernel(*args)

    try:
        # compiling draws nothing from the run's RNG
        with torch.random.fork_rng(devices=[]), _no_cuda_note():
            run(*example)
    except Exception as error:  # inductor could not build or run its kernel here
        text = str(error).strip()
        reason = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
        warnings.warn(
            f"qkv: {fn.__name__} is not compiled ({reason}); the eager way is used",
            stacklevel=2,
        )
        return None
    return run


class _NoCudaNote(logging.Filter):
    """Drops `torch.utils.cpp_extension`'s "No CUDA runtime is found" (see the module's note)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No CUDA runtime is found")


@contextmanager
def _no_cuda_note() -> Iterator[None]:
    """Within: torch's note that a CUDA build finds a toolkit but no GPU is not logged."""
    logger = logging.getLogger("torch.utils.cpp_extension")
    note = _NoCudaNote()
    logger.addFilter(note)
    try:
        yield
    finally:
        logger.removeFilter(note)
