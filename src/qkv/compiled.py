"""Small functions compiled by `torch.compile` (inductor), where eager torch is slow on the CPU.

Some passes over memory run faster as one generated C++ loop than as several eager operations:
dropout with its masks hashed in the loop (`qkv.model.dropout`) and the label-smoothed loss
(`qkv.training.fused_loss`) of a CPU training step. Such a function is compiled once per
process, for inputs of any size (dynamic shapes), and first run on an example. Where
torch.compile cannot work here (no C++ compiler, for one), `compiled` warns once and the caller
keeps its eager way, as it does while `allow(False)` (the training config's `compile=false`).
"""

from __future__ import annotations

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

    The example's sizes should be distinct and above 1 (inductor specialises sizes 0 and 1,
    and takes equal sizes for the same size until told otherwise), and as large as the work
    it stands for: inductor decides from them whether to spread a loop over the cores. Its
    tensors should be distinct objects, as the caller's will be (one tensor passed twice is
    compiled for that aliasing, and the first real call compiles again).

    The callers are the forward and backward functions of `torch.autograd.Function`s: the
    function returned runs `fn` with autograd off and its tensors detached, the example's
    too, since a change of grad mode or of a tensor's `requires_grad` compiles again.
    """
    kernel = torch.compile(fn, dynamic=True)

    def run(*args: Any) -> Any:
        with torch.no_grad():
            return kernel(*(a.detach() if isinstance(a, torch.Tensor) else a for a in args))

    try:
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
