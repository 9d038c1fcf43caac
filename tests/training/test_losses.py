"""The loss over real target tokens: `nonpad_logits` and `smoothed_cross_entropy`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qkv.fast.linear import Linear, padded_rows
from qkv.training.losses import nonpad_logits, smoothed_cross_entropy

PAD = 0


@pytest.mark.parametrize("lengths", [[5, 3, 1], [7, 7, 7], [1]])
def test_nonpad_logits_give_the_loss_and_gradients_of_the_real_rows(lengths: list[int]) -> None:
    torch.manual_seed(0)
    width = max(lengths)
    labels = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, length in enumerate(lengths):
        labels[row, :length] = torch.randint(1, 11, (length,))
    states = torch.randn(len(lengths), width, 6, requires_grad=True)
    output = Linear(6, 11)
    logits, picked = nonpad_logits(output, states, labels, PAD)
    count = sum(lengths)
    assert len(logits) == len(picked) == padded_rows(count)  # rounded up on the CPU
    assert torch.equal(picked[:count], labels[labels != PAD]) and (picked[count:] == PAD).all()
    loss = smoothed_cross_entropy(logits, picked, 0.1, ignore_index=PAD)
    loss.backward()
    ours = states.grad
    states.grad = None
    keep = labels != PAD
    expected = F.cross_entropy(
        F.linear(states[keep], output.weight, output.bias),
        labels[keep],
        label_smoothing=0.1,
        reduction="sum",
    )
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours, states.grad, rtol=1e-5, atol=1e-5)


def test_nonpad_logits_of_a_batch_with_no_targets_are_empty() -> None:
    labels = torch.zeros(2, 3, dtype=torch.long)
    logits, picked = nonpad_logits(Linear(4, 5), torch.randn(2, 3, 4), labels, PAD)
    assert logits.shape == (0, 5) and picked.shape == (0,)
