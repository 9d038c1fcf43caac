"""`qkv.fast.compiled`: a function compiled for any sizes, or None (with a warning) where it
fails."""

from __future__ import annotations

import importlib
import logging
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import Tensor

import qkv.fast.compiled
from qkv.fast.compiled import allow, allowed, compiled


def _scaled_sum(x: Tensor, scale: float) -> Tensor:
    return (x * scale).sum(1)


@pytest.fixture
def restored() -> Iterator[None]:
    kept = allowed()
    yield
    allow(kept)


def test_a_compiled_function_gives_the_eager_values_at_other_sizes() -> None:
    kernel = compiled(_scaled_sum, torch.randn(6, 10), 2.0)
    assert kernel is not None
    for shape in [(3, 7), (40, 33)]:
        x = torch.randn(shape)
        torch.testing.assert_close(kernel(x, 2.0), _scaled_sum(x, 2.0))


def test_where_compiling_fails_it_warns_once_and_gives_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(fn: Any, **_: Any) -> Any:
        def call(*args: Any) -> Any:
            raise RuntimeError("no working C++ compiler\nmore detail")

        return call

    monkeypatch.setattr(qkv.fast.compiled.torch, "compile", broken)
    with pytest.warns(UserWarning, match=r"_scaled_sum is not compiled \(RuntimeError: no work"):
        assert compiled(_scaled_sum, torch.randn(6, 10), 2.0) is None


def test_allow_switches_compiled_functions_off_and_on(restored: None) -> None:
    allow(False)
    assert not allowed()
    allow(True)
    assert allowed()


def test_tensors_that_need_gradients_are_run_detached_without_compiling_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The callers hand in activations that require gradients; a compile for those (or for
    autograd on) besides the example's would cost seconds at the first training step."""
    compiles: list[int] = []
    compile_for_real = torch.compile

    def counting(fn: Any, **kwargs: Any) -> Any:
        def backend(graph: Any, inputs: Any) -> Any:
            compiles.append(1)
            return graph.forward

        return compile_for_real(fn, backend=backend, **kwargs)

    monkeypatch.setattr(qkv.fast.compiled.torch, "compile", counting)
    kernel = compiled(_scaled_sum, torch.randn(6, 10), 2.0)
    assert kernel is not None and compiles == [1]
    x = torch.randn(5, 9, requires_grad=True)
    out = kernel(x, 2.0)
    assert not out.requires_grad
    torch.testing.assert_close(out, _scaled_sum(x.detach(), 2.0))
    assert compiles == [1]


def test_every_call_goes_through_torch_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """dynamo's own guards pick the version for each call; other dtypes, scales and strides
    give the eager values."""
    calls: list[int] = []
    compile_for_real = torch.compile

    def counting(fn: Any, **kwargs: Any) -> Any:
        kernel = compile_for_real(fn, **kwargs)

        def call(*args: Any) -> Any:
            calls.append(1)
            return kernel(*args)

        return call

    monkeypatch.setattr(qkv.fast.compiled.torch, "compile", counting)
    kernel = compiled(_scaled_sum, torch.randn(6, 10), 2.0)
    assert kernel is not None and len(calls) == 1  # the example
    y = torch.randn(4, 9)
    cases = [(torch.randn(3, 7), 2.0), (y.double(), 2.0), (y, 3.0), (y, -0.5), (y.t(), 2.0)]
    for x, scale in cases:
        torch.testing.assert_close(kernel(x, scale), _scaled_sum(x, scale))
    assert len(calls) == 1 + len(cases)


def test_torchs_no_cuda_runtime_note_is_dropped_while_the_example_compiles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A CUDA build of torch on a machine without a GPU logs it when inductor first builds."""
    logged: list[str] = []

    class Kept(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append(record.getMessage())

    logger = logging.getLogger("torch.utils.cpp_extension")
    handler = Kept()
    logger.addHandler(handler)
    compile_for_real = torch.compile

    def noting(fn: Any, **kwargs: Any) -> Any:
        kernel = compile_for_real(fn, **kwargs)

        def call(*args: Any) -> Any:
            logger.warning("No CUDA runtime is found, using CUDA_HOME='%s'", "/usr/local")
            logger.warning("another note")
            return kernel(*args)

        return call

    monkeypatch.setattr(qkv.fast.compiled.torch, "compile", noting)
    try:
        kernel = compiled(_scaled_sum, torch.randn(6, 10), 2.0)
        assert kernel is not None and logged == ["another note"]
        kernel(torch.randn(3, 7), 2.0)  # after the example: logged as torch logs it
        assert logged[1:] == [
            "No CUDA runtime is found, using CUDA_HOME='/usr/local'",
            "another note",
        ]
    finally:
        logger.removeHandler(handler)


def _noisy(x: Tensor) -> Tensor:
    return x + torch.rand_like(x)


def test_compiling_leaves_the_global_random_state_as_it_was() -> None:
    before = torch.get_rng_state()
    assert compiled(_noisy, torch.zeros(6, 10)) is not None
    assert torch.equal(torch.get_rng_state(), before)


BUILDERS = [
    "qkv.fast.dropout:_hashed_kernel",
]


@pytest.mark.parametrize("builder", BUILDERS)
def test_the_packages_kernels_compile_without_drawing_from_the_global_generator(
    builder: str,
) -> None:
    """A resumed run restores the random state and compiles again at its first step."""
    module_name, name = builder.split(":")
    build = getattr(importlib.import_module(module_name), name)
    build.cache_clear()
    before = torch.get_rng_state()
    assert build() is not None
    assert torch.equal(torch.get_rng_state(), before)


_BUILD_ALL = """
import importlib, sys
for builder in sys.argv[1:]:
    module_name, name = builder.split(":")
    assert getattr(importlib.import_module(module_name), name)() is not None, builder
print("built")
"""


def test_a_process_that_compiled_the_packages_kernels_exits_without_a_word_on_stderr() -> None:
    """Nothing of torch's at exit ("Exception ignored ..." from dynamo's clean-up of the code
    it made) or while compiling ("No CUDA runtime is found" from a CUDA build without a GPU)."""
    done = subprocess.run(
        [sys.executable, "-c", _BUILD_ALL, *BUILDERS],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "built"
    assert done.stderr == ""
