"""The decoding output layer: its logits and argmax, with tokens excluded."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from qkv.inference.output_layer import OutputLayer


def layer(vocab_size: int, d: int = 64, bias: bool = False, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    made = nn.Linear(d, vocab_size, bias=bias)
    nn.init.normal_(made.weight, std=d**-0.5)
    return made


@pytest.mark.parametrize("bias", [False, True])
def test_argmax_and_logits_are_the_layers(bias: bool) -> None:
    linear = layer(1027, bias=bias)
    x = torch.randn(33, 64)
    with torch.inference_mode():
        output = OutputLayer(linear)
        torch.testing.assert_close(output.logits(x), linear(x))
        assert torch.equal(output.argmax(x), linear(x).argmax(dim=-1))


def test_ties_go_to_the_first_token_as_with_argmax() -> None:
    linear = layer(1024)
    with torch.no_grad():
        linear.weight[900] = linear.weight[40]
        linear.weight[41] = linear.weight[40]
    x = linear.weight[40].detach().repeat(4, 1) * 5
    with torch.inference_mode():
        assert OutputLayer(linear).argmax(x).tolist() == [40, 40, 40, 40]


def test_never_tokens_are_never_chosen() -> None:
    linear = layer(1030)
    output = OutputLayer(linear, never=(3, 40))
    x = linear.weight[40].detach().repeat(4, 1) * 5  # token 40 would win
    with torch.inference_mode():
        found = output.argmax(x)
        logits = output.logits(x)
    assert bool(torch.isinf(logits[:, [3, 40]]).all())
    assert 40 not in found.tolist() and torch.equal(found, logits.argmax(dim=-1))


def test_a_copy_excluding_other_tokens_shares_the_frozen_weights() -> None:
    linear = layer(1024)
    output = OutputLayer(linear)
    x = linear.weight[40].detach().repeat(4, 1) * 5  # token 40 would win
    with torch.inference_mode():
        without = output.excluding((40,))
        assert 40 not in without.argmax(x).tolist()
        assert output.argmax(x).tolist() == [40] * 4  # the original is unchanged
    assert without.exact is output.exact


@pytest.mark.parametrize("never", [(-1,), (1024,), (3, 5000)])
def test_never_tokens_outside_the_vocabulary_are_refused(never: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=r"never: token ids must be in \[0, 1024\)"):
        OutputLayer(layer(1024), never=never)
    with pytest.raises(ValueError, match=r"never: token ids must be in \[0, 1024\)"):
        OutputLayer(layer(1024)).excluding(never)
