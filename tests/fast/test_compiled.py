"""`qkv.fast.compiled`: a function compiled for any sizes, or None (with a warning) where it
fails."""

from __future__ import annotations

import importlib
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


def _counting_wrapper(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the calls that go through `torch.compile`'s wrapper."""
    calls: list[int] = []
    compile_for_real = torch.compile

    def counting(fn: Any, **kwargs: Any) -> Any:
        kernel = compile_for_real(fn, **kwargs)

        def call(*args: Any) -> Any:
            calls.append(1)
            return kernel(*args)

        return call

    monkeypatch.setattr(qkv.fast.compiled.torch, "compile", counting)
    return calls


def test_calls_go_straight_to_the_compiled_code_whose_guards_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _counting_wrapper(monkeypatch)
    kernel = compiled(_scaled_sum, torch.randn(6, 10), 2.0)
    assert kernel is not None and len(calls) == 1  # the example
    for shape in [(3, 7), (40, 33), (6, 10)]:
        x = torch.randn(shape)
        torch.testing.assert_close(kernel(x, 2.0), _scaled_sum(x, 2.0))
    assert len(calls) == 1  # every size, straight to the compiled code


def test_inputs_whose_guards_fail_go_through_torch_compile_and_are_right(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _counting_wrapper(monkeypatch)
    kernel = compiled(_scaled_sum, torch.randn(6, 10), 2.0)
    assert kernel is not None
    x = torch.randn(4, 9, dtype=torch.float64)  # another dtype: compiled again
    torch.testing.assert_close(kernel(x, 2.0), _scaled_sum(x, 2.0))
    assert len(calls) == 2
    torch.testing.assert_close(kernel(x, 2.0), _scaled_sum(x, 2.0))
    assert len(calls) == 2  # now a version of its own
    y = torch.randn(4, 9)
    for scale in (3.0, -0.5):  # another scale: the versions' guards decide
        torch.testing.assert_close(kernel(y, scale), _scaled_sum(y, scale))
    torch.testing.assert_close(kernel(y.t(), 2.0), _scaled_sum(y.t(), 2.0))  # other strides


def test_direct_calls_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting_wrapper(monkeypatch)
    monkeypatch.setattr(qkv.fast.compiled, "DIRECT", False)
    kernel = compiled(_scaled_sum, torch.randn(6, 10), 2.0)
    assert kernel is not None
    x = torch.randn(3, 7)
    torch.testing.assert_close(kernel(x, 2.0), _scaled_sum(x, 2.0))
    assert len(calls) == 2


def test_where_dynamo_internals_cannot_be_read_every_call_goes_through_torch_compile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch._dynamo.eval_frame as eval_frame

    def missing(code: Any) -> Any:
        raise AttributeError("no cache entries here")

    monkeypatch.setattr(eval_frame, "_debug_get_cache_entry_list", missing)
    calls = _counting_wrapper(monkeypatch)
    kernel = compiled(_scaled_sum, torch.randn(6, 10), 2.0)
    assert kernel is not None
    x = torch.randn(3, 7)
    torch.testing.assert_close(kernel(x, 2.0), _scaled_sum(x, 2.0))
    assert len(calls) == 2


def _noisy(x: Tensor) -> Tensor:
    return x + torch.rand_like(x)


def test_compiling_leaves_the_global_random_state_as_it_was() -> None:
    before = torch.get_rng_state()
    assert compiled(_noisy, torch.zeros(6, 10)) is not None
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize(
    "builder",
    [
        "qkv.fast.fused_loss:_forward_kernel",
        "qkv.fast.fused_loss:_grad_kernel",
        "qkv.fast.dropout:_hashed_kernel",
        "qkv.fast.fused_ffn:_mask_kernel",
    ],
)
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
