from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from qkv.compiled import allow
from qkv.model import short_softmax
from qkv.model.masks import decoder_self_mask
from qkv.model.packed_attention import MASKED, packed_attention
from qkv.model.packing import Packing
from qkv.model.short_softmax import SHORT_ROW, softmax, softmax_backward


def _scores(length: int) -> torch.Tensor:
    """Group-shaped scores (H · B_g, T_g, S_g) with masked keys and a row masked whole."""
    scores = 3 * torch.randn(12, 7, length)
    scores[:, :, length - 1 :] += MASKED  # a padding key in every row
    scores[0, 0] = MASKED  # a row with nothing to attend to: uniform, as torch's
    return scores


def _counted(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Calls of the kernel that `short_softmax.<name>()` returns."""
    calls: list[int] = []
    make: Callable[[], Any] = getattr(short_softmax, name)
    kernel = make()
    if kernel is None:
        pytest.skip("compiled loops do not work here")

    def counted(*args: Any) -> torch.Tensor:
        calls.append(1)
        out: torch.Tensor = kernel(*args)
        return out

    monkeypatch.setattr(short_softmax, name, lambda: counted)
    return calls


@pytest.mark.parametrize("length", [1, 2, 11, 15])
def test_short_rows_go_to_the_compiled_loops_and_equal_torch(
    length: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    forward_calls = _counted(monkeypatch, "_forward_kernel")
    backward_calls = _counted(monkeypatch, "_backward_kernel")
    scores = _scores(length)
    weights = softmax(scores, training=True)
    torch.testing.assert_close(weights, torch.softmax(scores, dim=-1))
    grad = torch.randn_like(weights)
    expected = torch._softmax_backward_data(grad, weights, -1, weights.dtype) * 0.125
    torch.testing.assert_close(softmax_backward(grad, weights, 0.125), expected)
    assert forward_calls == [1] and backward_calls == [1]


def test_rows_of_a_vector_or_longer_go_to_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    forward_calls = _counted(monkeypatch, "_forward_kernel")
    backward_calls = _counted(monkeypatch, "_backward_kernel")
    scores = _scores(SHORT_ROW)
    weights = softmax(scores, training=True)
    assert torch.equal(weights, torch.softmax(scores, dim=-1))
    grad = torch.randn_like(weights)
    expected = torch._softmax_backward_data(grad, weights, -1, weights.dtype).mul_(0.5)
    assert torch.equal(softmax_backward(grad, weights, 0.5), expected)
    assert forward_calls == [] and backward_calls == []


def test_torch_kernels_where_compiled_loops_are_not_allowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    forward_calls = _counted(monkeypatch, "_forward_kernel")
    allow(False)
    try:
        scores = _scores(5)
        assert torch.equal(softmax(scores, training=True), torch.softmax(scores, dim=-1))
        doubled = scores.double()
        assert torch.equal(softmax(doubled, training=True), torch.softmax(doubled, dim=-1))
    finally:
        allow(True)
    assert forward_calls == []


def test_torch_kernel_where_no_backward_follows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoding's encoder pass: no compiler loaded into a decoding process for it."""
    forward_calls = _counted(monkeypatch, "_forward_kernel")
    scores = _scores(5)
    assert torch.equal(softmax(scores, training=False), torch.softmax(scores, dim=-1))
    assert forward_calls == []


@pytest.mark.parametrize("grad", [True, False])
def test_packed_attention_takes_the_loops_when_a_backward_may_follow(
    grad: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In training the softmax runs inside an autograd function, whose forward has grad mode
    off: the packed attention says whether a backward may follow."""
    forward_calls = _counted(monkeypatch, "_forward_kernel")
    tgt = torch.tensor([[5, 6, 7, 8, 9], [9, 5, 0, 0, 0]])
    rows = Packing.from_mask(tgt != 0, round_rows=True)
    queries = torch.randn(len(rows.index), 3 * 32, requires_grad=grad)
    with torch.set_grad_enabled(grad):
        packed_attention(queries, None, decoder_self_mask(tgt, 0), rows, rows, 4)
    assert len(forward_calls) == (1 if grad else 0)  # one group of rows shorter than 16
