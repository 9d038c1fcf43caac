from __future__ import annotations

import pytest
import torch

from qkv.fast.compiled import allow
from qkv.fast import fused_ffn
from qkv.fast.dropout import HASHED_MIN
from qkv.model.layers import FeedForward

D, F = 32, 1024
ROWS = HASHED_MIN // F + 44  # enough hidden elements to hash; not a padded row count
PADDED_ROWS = 320  # as packed batches come on a CPU: `padded_rows(320) == 320`


def _run(ffn: FeedForward, x: torch.Tensor, seed: int) -> tuple[torch.Tensor, ...]:
    """Output and gradients of one forward and backward under `seed`."""
    torch.manual_seed(seed)
    x = x.clone().requires_grad_(True)
    out = ffn(x)
    out.backward(torch.randn_like(out))
    grads = [x.grad, *(p.grad for p in ffn.parameters())]
    ffn.zero_grad(set_to_none=True)
    return out.detach(), *(g for g in grads if g is not None)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_fused_equals_the_three_layers_forward_and_backward(
    p: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    ffn = FeedForward(D, F, p).train()
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


def test_fused_backward_keeps_less() -> None:
    """The fused step keeps its input rows and its output, which the second layer keeps too
    (the same tensor, at a padded row count); the three layers keep the ReLU's output
    besides."""
    torch.manual_seed(0)
    ffn = FeedForward(D, F, 0.1).train()
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
    ffn = FeedForward(D, F, 0.0 if case == "p0" else 1.0 if case == "p1" else 0.1)
    ffn.train(case != "eval")
    if case == "gelu":
        ffn = FeedForward(D, F, 0.1, activation="gelu").train()
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
