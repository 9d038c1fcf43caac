"""The int8 screen of greedy search's argmax: the float32 logits' argmax, and a fallback to
them wherever the screen cannot decide or this torch cannot make it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from qkv.fast import screen
from qkv.fast.screen import Int8Screen, int8_matmuls_exact
from qkv.inference.output_layer import OutputLayer
from qkv.inference.search import first_argmax

pytestmark = pytest.mark.skipif(not int8_matmuls_exact(), reason="no exact int8 products here")

NONE = torch.tensor([], dtype=torch.long)


def weight(vocab_size: int = 1027, d: int = 64, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(vocab_size, d, generator=generator) * d**-0.5  # (V, D)


def screen_of(w: torch.Tensor) -> Int8Screen:
    made = Int8Screen.of(w)
    assert made is not None
    return made


def states(n: int, d: int = 64, seed: int = 1, scale: float = 3.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=generator)
    return nn.functional.layer_norm(x, (d,)) * scale  # (N, D) as a decoder's last states


@pytest.mark.parametrize("d", [64, 256])
@pytest.mark.parametrize("scale", [1e-3, 3.0, 1e4])
def test_the_screen_finds_the_float32_argmax(d: int, scale: float) -> None:
    w = weight(d=d)
    x = states(200, d, scale=scale)
    found = screen_of(w).argmax(x, NONE)
    assert found is not None
    assert torch.equal(found, (x @ w.t()).argmax(dim=-1))


def test_near_ties_are_settled_in_float32() -> None:
    """Rows whose best two logits differ by far less than the int8 products can tell apart."""
    w = weight()
    x = states(64)
    logits = x @ w.t()
    top = logits.topk(2, dim=-1).indices  # (N, 2)
    close = w.clone()
    for row, (first, second) in enumerate(top.tolist()[:16]):  # token `second` nudged up
        gap = float(logits[row, first] - logits[row, second])
        close[second] += x[row] / x[row].norm() ** 2 * gap * (1 - 1e-4 * (row % 2 * 2 - 1))
    found = screen_of(close).argmax(x, NONE)
    assert found is not None
    assert torch.equal(found, (x @ close.t()).argmax(dim=-1))


def test_never_tokens_are_skipped_and_ties_go_to_the_first() -> None:
    w = weight()
    w[900] = w[41] = w[40]
    x = w[40].repeat(20, 1) * 5  # token 40 (and its copies) would win
    assert screen_of(w).argmax(x, NONE).tolist() == [40] * 20  # type: ignore[union-attr]
    found = screen_of(w).argmax(x, torch.tensor([40, 3]))
    assert found is not None and found.tolist() == [41] * 20


@pytest.mark.parametrize("case", ["nan", "inf", "zeros", "equal logits"])
def test_rows_the_screen_cannot_decide_fall_back_to_the_float32_logits(case: str) -> None:
    w = weight()
    x = states(20)
    if case == "equal logits":
        w[:] = w[0]  # every token a candidate
    else:
        x[3] = {"nan": torch.nan, "inf": torch.inf, "zeros": 0.0}[case]
    assert screen_of(w).argmax(x, NONE) is None
    output = OutputLayer(nn.Linear(64, 1027, bias=False).requires_grad_(False))
    output.exact.linear.weight.copy_(w)  # type: ignore[union-attr]
    with torch.inference_mode():
        assert output.screens
        assert torch.equal(output.argmax(x), first_argmax(x @ w.t()))


def test_an_output_layer_screens_only_where_it_applies() -> None:
    def layer(vocab_size: int, d: int = 64, bias: bool = False) -> nn.Linear:
        return nn.Linear(d, vocab_size, bias=bias)

    assert OutputLayer(layer(1027)).screens
    assert not OutputLayer(layer(1027), fast=False).screens
    assert not OutputLayer(layer(1027, bias=True)).screens
    assert not OutputLayer(layer(1000)).screens  # a small vocabulary: float32 is as fast
    assert not OutputLayer(layer(1027, d=1100)).screens  # too wide for exact int32 sums
    assert not OutputLayer(layer(1027).double()).screens


@pytest.mark.parametrize("value", [torch.nan, torch.inf, 0.0, 2.0**-100])
def test_weights_not_finite_or_nearly_zero_get_no_screen(value: float) -> None:
    linear = nn.Linear(64, 1027, bias=False).requires_grad_(False)
    linear.weight.fill_(value)
    linear.weight[5, 0] = value * 2  # one token wins where the logits are finite
    assert Int8Screen.of(linear.weight) is None
    x = states(20)
    with torch.inference_mode():
        assert torch.equal(OutputLayer(linear).argmax(x), first_argmax(linear(x)))


@pytest.mark.parametrize("torch_lacks", ["the operator", "exact sums"])
def test_without_exact_int8_products_the_float32_logits_decide(
    torch_lacks: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback of the private `torch._int_mm`: where it is missing, or sums wrongly."""
    if torch_lacks == "the operator":
        monkeypatch.delattr(torch, "_int_mm")
    else:
        monkeypatch.setattr(torch, "_int_mm", lambda a, b: (a.int() @ b.int()).clamp(max=2**15))
    screen.int8_matmuls_exact.cache_clear()
    try:
        assert not screen.int8_matmuls_exact()
        linear = nn.Linear(64, 1027, bias=False)
        output = OutputLayer(linear)
        x = states(32)
        with torch.inference_mode():
            assert not output.screens
            assert torch.equal(output.argmax(x), linear(x).argmax(dim=-1))
    finally:
        screen.int8_matmuls_exact.cache_clear()
