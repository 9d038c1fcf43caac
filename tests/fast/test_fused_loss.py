"""`qkv.fast.fused_loss`: the compiled label-smoothed loss equals `F.cross_entropy`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qkv.fast import fused_loss
from qkv.fast.compiled import allow
from qkv.training.losses import smoothed_cross_entropy

PAD = 0


def _case(rows: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    logits = (3 * torch.randn(rows, vocab)).requires_grad_()
    labels = torch.randint(1, vocab, (rows,))
    labels[::7] = PAD  # ignored rows
    return logits, labels


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize(("rows", "vocab"), [(37, 1000), (300, 4097)])
def test_loss_and_gradient_are_those_of_f_cross_entropy(
    smoothing: float, rows: int, vocab: int
) -> None:
    logits, labels = _case(rows, vocab)
    loss = fused_loss.smoothed_cross_entropy(logits, labels, smoothing, PAD)
    (0.25 * loss).backward()  # the loss's own gradient is taken into account
    ours = logits.grad
    logits.grad = None
    expected = F.cross_entropy(
        logits, labels, ignore_index=PAD, label_smoothing=smoothing, reduction="sum"
    )
    (0.25 * expected).backward()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(ours, logits.grad, rtol=1e-5, atol=1e-6)
    assert ours is not None and torch.all(ours[labels == PAD] == 0)


def test_applies_to_big_cpu_float32_training_losses_only() -> None:
    rows = fused_loss.MIN_ELEMENTS // 1024
    logits = torch.randn(rows, 1024, requires_grad=True)
    assert fused_loss.applies(logits)
    assert not fused_loss.applies(logits[:-1])  # too small to pay for compiling
    assert not fused_loss.applies(logits.detach())  # no gradient: evaluation
    with torch.no_grad():
        assert not fused_loss.applies(logits)
    assert not fused_loss.applies(logits.double())
    allow(False)
    try:
        assert not fused_loss.applies(logits)
    finally:
        allow(True)


def test_smoothed_cross_entropy_takes_the_compiled_loss_where_it_applies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    logits, labels = _case(64, 500)
    calls: list[int] = []
    monkeypatch.setattr(fused_loss, "MIN_ELEMENTS", logits.numel())
    original = fused_loss.smoothed_cross_entropy

    def counted(*args: object) -> torch.Tensor:
        calls.append(1)
        return original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(fused_loss, "smoothed_cross_entropy", counted)
    loss = smoothed_cross_entropy(logits, labels, 0.1, ignore_index=PAD)
    assert calls == [1]
    expected = F.cross_entropy(
        logits, labels, ignore_index=PAD, label_smoothing=0.1, reduction="sum"
    )
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-3)


def test_without_a_compiled_backward_the_eager_gradient_is_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    logits, labels = _case(50, 900)
    fused_loss.smoothed_cross_entropy(logits, labels, 0.1, PAD).backward()
    compiled_grad, logits.grad = logits.grad, None
    monkeypatch.setattr(fused_loss, "_grad_kernel", lambda: None)
    fused_loss.smoothed_cross_entropy(logits, labels, 0.1, PAD).backward()
    torch.testing.assert_close(logits.grad, compiled_grad)
