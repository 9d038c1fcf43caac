"""Small functions compiled by `torch.compile` (inductor), where eager torch is slow on the CPU.

Some passes over memory run faster as one generated C++ loop than as several eager operations:
dropout with its masks hashed in the loop (`qkv.fast.dropout`) and the label-smoothed loss
(`qkv.fast.fused_loss`) of a CPU training step. Such a function is compiled once per
process, for inputs of any size (dynamic shapes), and first run on an example. Where
torch.compile cannot work here (no C++ compiler, for one), `compiled` warns once and the caller
keeps its eager way, as it does while `allow(False)` (the training config's `compile=false`).

A call goes straight to dynamo's compiled code once its guards pass (`_Versions`): the way in
through `torch.compile`'s wrapper and frame hook costs some 0.1 ms a call within a training
step (about 100 calls), where the guards and the code themselves take a few microseconds.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Callable
from typing import Any

import torch

_allowed = [True]

DIRECT = True
"""Whether calls go straight to the compiled code whose guards pass (`_Versions`)."""


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
    versions = _Versions(fn)

    def run(*args: Any) -> Any:
        with torch.no_grad():
            args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
            direct = versions.find(args) if DIRECT else None
            if direct is not None:
                return direct(*args)
            out = kernel(*args)
            if DIRECT:
                versions.read()  # this call may have compiled a new version
            return out

    try:
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
    return run


class _Versions:
    """The versions dynamo compiled of a function, each as its guards' check and its compiled
    code made into a function of the same arguments, tried in dynamo's order.

    The code is what dynamo itself runs once the guards pass; the checks are dynamo's own,
    grad mode and each tensor's dtype, device, sizes' range and aliasing included. Where these
    internals cannot be read (another torch), there are no versions and every call goes
    through `torch.compile`.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        code = fn.__code__
        self.names = code.co_varnames[: code.co_argcount]
        self.versions: list[tuple[Callable[[dict[str, Any]], bool], Callable[..., Any]]] = []

    def read(self) -> None:
        try:
            from torch._dynamo.eval_frame import _debug_get_cache_entry_list

            entries = _debug_get_cache_entry_list(self.fn.__code__)
            self.versions = [
                (entry.guard_manager.check, types.FunctionType(entry.code, self.fn.__globals__))
                for entry in entries
            ]
        except Exception:  # any failure here means: every call goes through torch.compile
            self.versions = []

    def find(self, args: tuple[Any, ...]) -> Callable[..., Any] | None:
        """The compiled code whose guards `args` pass, or None."""
        if not self.versions or len(args) != len(self.names):
            return None
        local = dict(zip(self.names, args, strict=True))
        for check, code in self.versions:
            if check(local):
                return code
        return None
