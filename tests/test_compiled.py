"""`qkv.compiled`: a function compiled for any sizes, or None (with a warning) where it fails."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import Tensor

import qkv.compiled
from qkv.compiled import allow, allowed, compiled


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

    monkeypatch.setattr(qkv.compiled.torch, "compile", broken)
    with pytest.warns(UserWarning, match=r"_scaled_sum is not compiled \(RuntimeError: no work"):
        assert compiled(_scaled_sum, torch.randn(6, 10), 2.0) is None


def test_allow_switches_compiled_functions_off_and_on(restored: None) -> None:
    allow(False)
    assert not allowed()
    allow(True)
    assert allowed()
