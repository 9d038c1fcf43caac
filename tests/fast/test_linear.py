"""`linear`: oneDNN's products on the CPU, equal to `F.linear` forward and backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qkv.fast.linear import (
    STEPS_PER_DOUBLING,
    Linear,
    _padded,
    _weight_grad,
    linear,
    padded_rows,
)


def grads(fn, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, seed: int = 1):
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    b = None if b is None else b.detach().requires_grad_()
    out = fn(x, w, b)
    torch.manual_seed(seed)
    out.backward(torch.randn_like(out))
    return out, x.grad, w.grad, None if b is None else b.grad


@pytest.mark.parametrize("shape", [(7, 24), (3, 5, 24), (1, 24)])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("width", [40, 10])  # the weight's gradient: wider or narrower out
def test_linear_matches_f_linear_forward_and_backward(
    shape: tuple[int, ...], with_bias: bool, width: int
) -> None:
    torch.manual_seed(0)
    x, w = torch.randn(*shape), torch.randn(width, 24)
    b = torch.randn(width) if with_bias else None
    ours, theirs = grads(linear, x, w, b), grads(F.linear, x, w, b)
    for a, e in zip(ours, theirs, strict=True):
        if e is None:
            assert a is None
        else:
            assert a.shape == e.shape
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)


def test_linear_takes_transposed_inputs_and_only_the_gradients_asked_for() -> None:
    torch.manual_seed(0)
    x = torch.randn(24, 6).t()  # (6, 24), not contiguous
    w = torch.randn(40, 24, requires_grad=True)
    out = linear(x, w)
    torch.testing.assert_close(out, F.linear(x, w), rtol=1e-4, atol=1e-4)
    out.sum().backward()
    torch.testing.assert_close(w.grad, torch.ones(6, 40).t() @ x, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("width", [40, 10])
def test_the_weight_gradient_comes_in_the_weight_own_layout(width: int) -> None:
    """Contiguous, whichever factor was transposed: autograd keeps it without a copy."""
    torch.manual_seed(0)
    grad, inputs = torch.randn(32, width), torch.randn(32, 24)
    out = _weight_grad(grad, inputs)
    assert out.shape == (width, 24) and out.is_contiguous()
    torch.testing.assert_close(out, grad.t() @ inputs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("missing", ["onednn_available", "preferred"])
def test_without_onednn_linear_is_f_linear(missing: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback where this torch lacks oneDNN's private linear operator, and where MKL's
    products are preferred (Intel's CPUs)."""
    from qkv.fast import linear as onednn

    monkeypatch.setattr(onednn, missing, lambda: False)
    monkeypatch.setattr(onednn, "onednn_linear", None)  # would fail if called
    torch.manual_seed(0)
    x, w, b = torch.randn(6, 8), torch.randn(5, 8), torch.randn(5)
    for a, e in zip(grads(linear, x, w, b), grads(F.linear, x, w, b), strict=True):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("case", ["bf16", "autocast", "empty", "1-d"])
def test_linear_is_f_linear_where_onednn_does_not_apply(case: str) -> None:
    torch.manual_seed(0)
    x, w, b = torch.randn(4, 8), torch.randn(5, 8), torch.randn(5)
    if case == "bf16":
        x, w, b = x.bfloat16(), w.bfloat16(), b.bfloat16()
    elif case == "empty":
        x = x[:0]
    elif case == "1-d":
        x = x[0]
    if case == "autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ours, theirs = linear(x, w, b), F.linear(x, w, b)
    else:
        ours, theirs = linear(x, w, b), F.linear(x, w, b)
    assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)


def test_linear_layer_keeps_nn_linear_parameters_and_state_dict() -> None:
    torch.manual_seed(0)
    layer, plain = Linear(8, 5), nn.Linear(8, 5)
    plain.load_state_dict(layer.state_dict())
    assert isinstance(layer, nn.Linear) and list(layer.state_dict()) == ["weight", "bias"]
    x = torch.randn(3, 8)
    torch.testing.assert_close(layer(x), plain(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("count", [1, 7, 8, 100, 1000, 1023, 1024, 2049, 5000])
def test_padded_rows_round_up_to_few_shapes_with_zeros_below(count: int) -> None:
    rows = torch.randn(count, 3)
    padded = _padded(rows)
    assert torch.equal(padded[:count], rows) and not padded[count:].any()
    assert len(padded) % 8 == 0 and 0 <= len(padded) - count < max(8, count / STEPS_PER_DOUBLING)
    assert len(padded) == padded_rows(count) and padded_rows(len(padded)) == len(padded)
    shapes = {len(_padded(torch.empty(n, 1))) for n in range(1025, 2049)}
    assert len(shapes) == STEPS_PER_DOUBLING  # one doubling of row counts


def test_rows_past_the_padding_never_reach_the_output() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16, requires_grad=True)  # 10 rows, padded to 16
    w = torch.randn(12, 16, requires_grad=True)
    out = linear(x, w)
    assert out.shape == (2, 5, 12) and out.is_contiguous()
    out.backward(torch.ones_like(out))
    assert x.grad is not None and x.grad.shape == x.shape
    torch.testing.assert_close(x.grad, torch.ones(2, 5, 12) @ w.detach(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("vendor", "expected"), [("GenuineIntel", False), ("AuthenticAMD", True)])
def test_onednn_is_preferred_off_intel_cpus(
    vendor: str, expected: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qkv.fast import linear as onednn

    monkeypatch.undo()  # the fixture's forced choice
    monkeypatch.setattr(onednn, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(onednn, "onednn_available", lambda: True)
    onednn.preferred.cache_clear()
    try:
        assert onednn.preferred() is expected
    finally:
        onednn.preferred.cache_clear()


@pytest.mark.parametrize(
    ("text", "vendor", "bf16"),
    [
        ("vendor_id\t: AuthenticAMD\nflags\t\t: fpu avx512f avx512_bf16\n", "AuthenticAMD", True),
        ("vendor_id\t: GenuineIntel\nflags\t\t: fpu avx512f\n", "GenuineIntel", False),
        (None, "the platform's", False),  # /proc/cpuinfo unreadable (not Linux, say)
    ],
)
def test_the_cpu_is_read_from_proc_cpuinfo_or_else_from_the_platform(
    text: str | None, vendor: str, bf16: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pathlib import Path

    from qkv.fast import frozen_linear
    from qkv.fast import linear as onednn

    def read_text(path: Path, *args: object, **kwargs: object) -> str:
        if text is None:
            raise PermissionError(f"{path}: not readable")
        return text

    monkeypatch.setattr(Path, "read_text", read_text)
    monkeypatch.setattr(onednn.platform, "processor", lambda: "the platform's")
    onednn.cpu_info.cache_clear()
    try:
        assert onednn.cpu_vendor() == vendor
        assert frozen_linear._bf16_instructions() is bf16
    finally:
        onednn.cpu_info.cache_clear()
