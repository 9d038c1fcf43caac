"""The decoding output layer: its logits, and their argmax through the bf16 screen."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from qkv.fast.frozen_linear import cpu_bf16_matmuls
from qkv.inference import output_layer
from qkv.inference.output_layer import MIN_ROWS, MIN_VOCAB, OutputLayer


def layer(vocab_size: int, d: int = 64, bias: bool = False, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    made = nn.Linear(d, vocab_size, bias=bias)
    nn.init.normal_(made.weight, std=d**-0.5)
    if bias:
        nn.init.normal_(made.bias, std=0.5)
    return made


def states(rows: int, d: int = 64, seed: int = 1) -> Tensor:
    """Rows like a decoder's: layer-normed, with a few large coordinates."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, d, generator=generator)
    x[:, :3] *= 8
    return nn.functional.layer_norm(x, (d,))


@pytest.mark.parametrize(
    ("vocab_size", "bias", "rows"),
    [(1000, False, 64), (1027, True, 33), (130, True, 5), (4096, False, 320), (1027, False, 7)],
)
def test_screened_argmax_is_the_argmax_of_the_float32_logits(
    vocab_size: int, bias: bool, rows: int
) -> None:
    linear = layer(vocab_size, bias=bias)
    output = OutputLayer(linear, rows, screen=True)
    x = states(rows)
    with torch.inference_mode():
        assert torch.equal(output.argmax(x), output.logits(x).argmax(dim=-1))
    rounded = output.rounded
    assert rounded is not None  # it did screen
    assert rounded.plain == (rounded.blocked is None)  # held in one layout: reordered, if it can be


def test_the_screen_keeps_every_token_within_its_error_bound() -> None:
    """Near-ties inside the screen's error: several tokens are candidates, float32 decides."""
    d, vocab_size = 64, 1024
    linear = layer(vocab_size, d)
    with torch.no_grad():
        base = linear.weight[7].clone()
        for i, token in enumerate((100, 300, 700, 1000)):  # within bf16 rounding of token 7
            linear.weight[token] = base * (1 + (i + 1) * 2e-4)
    output = OutputLayer(linear, 8, screen=True)
    x = base.repeat(8, 1) + 0.01 * torch.randn(8, d)
    with torch.inference_mode():
        exact = output.logits(x)
        assert torch.equal(output.argmax(x), exact.argmax(dim=-1))
        assert output.candidates >= 5 * 8  # the five near-equal tokens in every row
        assert set(exact.argmax(dim=-1).tolist()) <= {7, 100, 300, 700, 1000}


@pytest.mark.parametrize(("d", "vocab_size"), [(256, 2048), (1024, 2051)])
def test_the_screened_logits_stay_within_the_bound(d: int, vocab_size: int) -> None:
    output = OutputLayer(layer(vocab_size, d, bias=True), 64, screen=True)
    x = states(64, d, seed=3) * torch.logspace(-3, 3, 64)[:, None]  # norms over six decades
    with torch.inference_mode():
        screen = output._prepare_screen()
        screened = screen.rounded(x.to(torch.bfloat16)).float()[:, :vocab_size]
        screened += linear_bias(output)
        error = (screened.double() - output.logits(x).double()).abs().amax(dim=-1)  # (N,)
        bound = (screen.scale * x.norm(dim=1) + screen.offset) / 2  # e(h)
        assert torch.equal(output.argmax(x), output.logits(x).argmax(dim=-1))
    assert bool((error <= bound).all())


def near_equal_rows(x_scale: float, w_scale: float) -> tuple[OutputLayer, Tensor]:
    """Nine tokens within bf16's rounding of token 7, and rows close to token 7's weight."""
    linear = layer(1024)
    with torch.no_grad():
        base = linear.weight[7].clone()
        for token in range(100, 1000, 100):
            linear.weight[token] = base + 3e-3 * torch.randn(64) * base.abs().mean()
        linear.weight.mul_(w_scale)
    x = (base.repeat(64, 1) + 0.01 * torch.randn(64, 64)) * x_scale
    return OutputLayer(linear, 64, screen=True), x


@pytest.mark.parametrize(("x_scale", "w_scale"), [(1e-24, 1.0), (1e-25, 1.0), (1.0, 1e-25)])
def test_rows_and_weights_so_small_that_their_float32_squares_vanish(
    x_scale: float, w_scale: float
) -> None:
    torch.manual_seed(0)
    output, x = near_equal_rows(x_scale, w_scale)
    with torch.inference_mode():
        assert torch.equal(output.argmax(x), output.logits(x).argmax(dim=-1))


def test_subnormal_rows_which_the_bf16_matmul_reads_as_zero() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(64, 1024)
    with torch.no_grad():
        linear.weight.normal_().mul_(1e12)
        linear.bias.normal_().mul_(1e-27)
    output = OutputLayer(linear, 32, screen=True)
    x = torch.randn(32, 64) * 1e-39
    with torch.inference_mode():
        assert torch.equal(output.argmax(x), output.logits(x).argmax(dim=-1))


def test_equal_logits_fall_back_instead_of_settling_every_token() -> None:
    linear = layer(4096)
    with torch.no_grad():
        linear.weight.zero_()
    output = OutputLayer(linear, 32, screen=True)
    with torch.inference_mode():
        assert output.argmax(states(32)).tolist() == [0] * 32  # argmax's first maximum
    assert output.candidates == 32 * 4096  # counted, then left to the float32 logits


def test_ties_go_to_the_first_token_as_with_argmax() -> None:
    linear = layer(1024)
    with torch.no_grad():
        linear.weight[900] = linear.weight[40]
        linear.weight[41] = linear.weight[40]
    output = OutputLayer(linear, 4, screen=True)
    x = linear.weight[40].detach().repeat(4, 1) * 5
    with torch.inference_mode():
        assert output.argmax(x).tolist() == [40, 40, 40, 40]


def test_never_tokens_are_never_chosen() -> None:
    linear = layer(1030)  # tokens beyond the last whole block of 64 too
    output = OutputLayer(linear, 4, never=(3, 40), screen=True)
    x = linear.weight[40].detach().repeat(4, 1) * 5  # token 40 would win
    with torch.inference_mode():
        found = output.argmax(x)
        logits = output.logits(x)
    assert bool(torch.isinf(logits[:, [3, 40]]).all())
    assert 40 not in found.tolist() and torch.equal(found, logits.argmax(dim=-1))


def test_a_copy_excluding_other_tokens_shares_the_frozen_weights() -> None:
    linear = layer(1024)
    output = OutputLayer(linear, 4, screen=True)
    x = linear.weight[40].detach().repeat(4, 1) * 5  # token 40 would win
    with torch.inference_mode():
        assert output.argmax(x).tolist() == [40] * 4
        without = output.excluding((40,))
        assert 40 not in without.argmax(x).tolist()
        assert output.argmax(x).tolist() == [40] * 4  # the original is unchanged
        assert without.rounded is output.rounded is not None  # one bf16 copy
        late = OutputLayer(linear, 4, screen=True)
        twin = late.excluding(())
        twin.argmax(x)  # a copy's first screen is made for the original too
        assert late.rounded is twin.rounded is not None


@pytest.mark.parametrize("never", [(-1,), (1024,), (3, 5000)])
def test_never_tokens_outside_the_vocabulary_are_refused(never: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=r"never: token ids must be in \[0, 1024\)"):
        OutputLayer(layer(1024), 4, never=never)
    with pytest.raises(ValueError, match=r"never: token ids must be in \[0, 1024\)"):
        OutputLayer(layer(1024), 4).excluding(never)


def test_rows_without_a_candidate_fall_back_to_the_float32_logits() -> None:
    output = OutputLayer(layer(1024), 3, screen=True)
    x = states(3)
    x[1, 5] = float("nan")
    x[2, 0] = float("inf")
    with torch.inference_mode():
        assert torch.equal(output.argmax(x), output.logits(x).argmax(dim=-1))
        assert output.argmax(x[:0]).shape == (0,)


def test_the_screen_is_off_and_the_cpu_unprobed_for_weights_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def probe() -> bool:
        raise AssertionError("the CPU's bf16 matmuls were probed for weights on another device")

    monkeypatch.setattr(output_layer, "cpu_bf16_matmuls", probe)
    assert not OutputLayer(layer(MIN_VOCAB).to("meta"), 8).screens  # as on a GPU


def test_where_the_screen_applies() -> None:
    big, small = layer(MIN_VOCAB), layer(MIN_VOCAB - 1)
    assert OutputLayer(big, 8).screens == cpu_bf16_matmuls()
    assert not OutputLayer(small, 8).screens
    assert not OutputLayer(big, 8, screen=False).screens
    assert not OutputLayer(big.to(torch.bfloat16), 8, screen=True).screens  # already bf16
    with torch.inference_mode():
        output = OutputLayer(layer(MIN_VOCAB), 8)
        output.screens = True  # as on a CPU with native bf16 matmuls
        output.argmax(states(MIN_ROWS - 1))
        assert output.rounded is None  # too few rows to pay
        output.argmax(states(MIN_ROWS))
        assert output.rounded is not None
    with torch.inference_mode():  # bf16 rows take the exact path
        output = OutputLayer(big, 8, screen=True)
        x = states(8).to(torch.bfloat16)
        expected = big.to(torch.bfloat16)(x).argmax(dim=-1)
        assert torch.equal(output.argmax(x), expected)


def linear_bias(output: OutputLayer) -> Tensor | float:
    return 0.0 if output.bias is None else output.bias


def test_norms_in_chunks_are_the_norms_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = torch.randn(1000, 48) * torch.logspace(-25, 3, 1000)[:, None]  # tiny squares too
    whole = torch.linalg.vector_norm(rows, dim=1, dtype=torch.float64).float()
    monkeypatch.setattr(output_layer, "NORM_CHUNK", 64)
    assert torch.equal(output_layer._norms(rows), whole)
