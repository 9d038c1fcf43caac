from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn

import qkv.fast
from qkv.fast import fused_ffn
from qkv.fast.compiled import allow
from qkv.fast.dropout import HASHED_MIN, dropped_levels
from qkv.fast.fused_ffn import FusedFeedForward
from qkv.model.layers import FeedForward

D, F = 32, 1024
ROWS = HASHED_MIN // F + 44  # enough hidden elements to hash; not a padded row count
PADDED_ROWS = 320  # as packed batches come on a CPU: `padded_rows(320) == 320`


def fast_ffn(p: float, activation: str = "relu") -> FusedFeedForward:
    """A feed-forward network made fast: `FusedFeedForward` around qkv's `Linear` and
    `Dropout`."""
    ffn = qkv.fast.apply(FeedForward(D, F, p, activation))
    assert isinstance(ffn, FusedFeedForward)
    return ffn


class FixedMask(nn.Module):
    """Dropout with a given multiplier (0 or 1 / keep probability per element)."""

    def __init__(self, multiplier: Tensor) -> None:
        super().__init__()
        self.multiplier = multiplier

    def forward(self, x: Tensor) -> Tensor:
        return x * self.multiplier


def _run(ffn: FeedForward, x: torch.Tensor, seed: int) -> tuple[torch.Tensor, ...]:
    """Output and gradients of one forward and backward under `seed`."""
    torch.manual_seed(seed)
    x = x.clone().requires_grad_(True)
    out = ffn(x)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)))
    grads = [x.grad, *(p.grad for p in ffn.parameters())]
    ffn.zero_grad(set_to_none=True)
    return out.detach(), *(g for g in grads if g is not None)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_fused_equals_the_three_layers_forward_and_backward(
    p: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    ffn = fast_ffn(p).train()
    x = torch.randn(2, ROWS // 2, D)
    assert fused_ffn.applies(x, ffn.linear1.weight, ffn.linear1.bias, p)
    calls: list[int] = []
    fused = fused_ffn.linear_relu_dropout

    def counted(*args: object) -> torch.Tensor:
        calls.append(1)
        return fused(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(fused_ffn, "linear_relu_dropout", counted)
    expected_fused = _run(ffn, x, seed=7)
    assert calls == [1]
    monkeypatch.setattr(fused_ffn, "applies", lambda *args: False)
    expected = _run(ffn, x, seed=7)
    assert calls == [1]  # the three layers this time
    assert len(expected_fused) == len(expected) == 6  # output, x and four parameters
    for got, want in zip(expected_fused, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the same mask: the same draws from torch's generator
    hidden = torch.relu(ffn.linear1(x))
    torch.manual_seed(7)
    dropped = ffn.dropout(hidden)
    torch.manual_seed(7)
    fused_hidden = fused(x, ffn.linear1.weight, ffn.linear1.bias, p)
    assert torch.equal(fused_hidden == 0, dropped == 0)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_fused_equals_the_reference_network_under_the_same_mask(p: float) -> None:
    torch.manual_seed(0)
    ffn = fast_ffn(p).train()
    reference = qkv.fast.reference(copy.deepcopy(ffn))
    assert type(reference.linear1) is nn.Linear and type(reference.dropout) is nn.Dropout
    x = torch.randn(ROWS, D)
    torch.manual_seed(7)
    kept = fused_ffn.linear_relu_dropout(x, ffn.linear1.weight, ffn.linear1.bias, p) != 0
    scale = 65536 / (65536 - dropped_levels(p))
    reference.dropout = FixedMask(kept * scale)  # type: ignore[assignment]
    got, expected = _run(ffn, x, seed=7), _run(reference, x, seed=7)
    assert len(got) == len(expected) == 6
    for mine, theirs in zip(got, expected, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["eval", "p0"])
def test_without_dropout_fused_is_the_reference_network(case: str) -> None:
    torch.manual_seed(0)
    ffn = fast_ffn(0.0 if case == "p0" else 0.1).train(case == "p0")
    reference = qkv.fast.reference(copy.deepcopy(ffn))
    x = torch.randn(ROWS, D)
    for mine, theirs in zip(_run(ffn, x, seed=1), _run(reference, x, seed=1), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)


def test_fused_backward_keeps_less() -> None:
    """The fused step keeps its input rows and its output, which the second layer keeps too
    (the same tensor, at a padded row count); the three layers keep the ReLU's output
    besides."""
    torch.manual_seed(0)
    ffn = fast_ffn(0.1).train()
    x = torch.randn(PADDED_ROWS, D)

    def saved_bytes(fused: bool) -> int:
        kept: dict[tuple[int, int], int] = {}  # each tensor once, however often saved

        def pack(t: torch.Tensor) -> torch.Tensor:
            kept[t.data_ptr(), t.numel()] = t.numel() * t.element_size()
            return t

        applies = (lambda *a: True) if fused else (lambda *a: False)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(fused_ffn, "applies", applies)
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                ffn(x.requires_grad_(True))
        return sum(kept.values())

    hidden = PADDED_ROWS * F * 4
    assert saved_bytes(fused=False) - saved_bytes(fused=True) >= hidden


@pytest.mark.parametrize(
    "case", ["eval", "no_grad", "small", "p0", "p1", "float64", "not_allowed", "gelu"]
)
def test_the_three_layers_where_fusing_does_not_apply(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    ffn = fast_ffn(0.0 if case == "p0" else 1.0 if case == "p1" else 0.1)
    ffn.train(case != "eval")
    if case == "gelu":
        ffn = fast_ffn(0.1, activation="gelu").train()
    x = torch.randn(8 if case == "small" else ROWS, D)
    if case == "float64":
        ffn, x = ffn.double(), x.double()
    monkeypatch.setattr(fused_ffn, "linear_relu_dropout", _never)
    if case == "not_allowed":
        allow(False)
    try:
        if case == "no_grad":
            with torch.no_grad():
                out = ffn(x)
        else:
            out = ffn(x)
    finally:
        allow(True)
    assert out.shape == x.shape


def _never(*args: object) -> torch.Tensor:
    raise AssertionError("fused where it should not be")
