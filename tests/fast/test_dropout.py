import pytest
import torch

from qkv.fast.compiled import allow
from qkv.fast.dropout import (
    HASHED_MIN,
    Dropout,
    _hashed_applies,
    _hashed_kernel,
    drop_mask,
    dropout,
    hashed_dropout,
)


def test_drop_rate_and_mean_are_those_of_nn_dropout() -> None:
    x = torch.ones(400_000)
    out = dropout(x, 0.1)
    dropped = (out == 0).float().mean().item()
    assert dropped == pytest.approx(0.1, abs=0.003)
    assert out.mean().item() == pytest.approx(1.0, abs=0.005)  # kept values scaled by 1/(1-p)
    assert torch.allclose(out[out != 0], torch.tensor(65536 / (65536 - 6554)))


def test_every_16_bit_slice_is_used() -> None:
    """All four slices of each 64-bit draw are uniform: no position in a run of 4 is favoured."""
    mask = drop_mask(torch.Size([4 * 100_000]), 0.5).view(-1, 4).float().mean(0)
    torch.testing.assert_close(mask, torch.full((4,), 0.5), atol=0.01, rtol=0)


def test_repeatable_under_manual_seed_and_identity_in_eval() -> None:
    layer = Dropout(0.3)
    x = torch.randn(7, 5)
    torch.manual_seed(3)
    first = layer(x)
    torch.manual_seed(3)
    assert torch.equal(first, layer(x))
    assert torch.equal(layer.eval()(x), x)


def test_gradient_flows_through_kept_elements_only() -> None:
    x = torch.randn(6, 9, requires_grad=True)
    out = dropout(x, 0.5)
    out.sum().backward()
    assert x.grad is not None
    kept = out.detach() != 0
    torch.testing.assert_close(x.grad[kept], torch.full_like(x.grad[kept], 2.0))
    assert torch.all(x.grad[~kept] == 0)


def test_edge_probabilities() -> None:
    x = torch.randn(3, 4)
    assert torch.equal(dropout(x, 0.0), x)
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    assert drop_mask(torch.Size([0]), 0.1).shape == (0,)


def test_dropout_zeros_where_the_mask_of_the_same_draw_drops() -> None:
    x = torch.randn(1000, 7) + 10.0  # no zeros of its own
    torch.manual_seed(3)
    mask = drop_mask(x.shape, 0.3)
    torch.manual_seed(3)
    out = dropout(x, 0.3)
    assert torch.equal(out == 0, mask)
    torch.testing.assert_close(out[~mask], x[~mask] * (65536 / (65536 - round(0.3 * 65536))))


# SplitMix64 in plain Python integers: the reference for the hashed masks.
_M64 = (1 << 64) - 1


def _splitmix64(state: int) -> int:
    z = state & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


@pytest.mark.parametrize("seed", [0, 123_456_789, -(1 << 63), (1 << 63) - 1])
def test_hashed_masks_are_splitmix64_words_cut_into_four_slices(seed: int) -> None:
    levels, words = 30_000, 50
    out = hashed_dropout(torch.ones(4 * words), torch.tensor(seed), levels, 2.0)
    expected = [
        2.0 if (_splitmix64(seed + j * 0x9E3779B97F4A7C15) >> (16 * k)) & 0xFFFF >= levels else 0.0
        for j in range(words)
        for k in range(4)
    ]
    assert torch.equal(out, torch.tensor(expected))


def test_the_compiled_hashed_loop_equals_the_eager_one() -> None:
    kernel = _hashed_kernel()
    assert kernel is not None, "torch.compile does not work here"
    x = torch.randn(HASHED_MIN + 12_345)
    seed = torch.tensor(987_654_321_987)
    assert torch.equal(kernel(x, seed, 6554, 1.25), hashed_dropout(x, seed, 6554, 1.25))


def test_big_cpu_dropout_is_hashed_with_the_rate_mean_and_gradient_of_nn_dropout() -> None:
    x = (torch.rand(HASHED_MIN // 64, 64) + 1.0).requires_grad_()  # no zeros of its own
    assert _hashed_applies(x)
    torch.manual_seed(5)
    out = dropout(x, 0.1)
    torch.manual_seed(5)
    assert torch.equal(out, dropout(x, 0.1))  # repeatable
    dropped = out == 0
    assert dropped.float().mean().item() == pytest.approx(6554 / 65536, abs=0.003)
    scale = 65536 / (65536 - 6554)
    torch.testing.assert_close(out[~dropped], x.detach()[~dropped] * scale)
    # slice positions in a word are alike
    rates = dropped.view(-1, 4).float().mean(0)
    torch.testing.assert_close(rates, torch.full((4,), 0.1), atol=0.005, rtol=0)
    grad = torch.randn_like(out)
    out.backward(grad)  # the mask made again from the seed
    assert x.grad is not None
    torch.testing.assert_close(x.grad, torch.where(dropped, 0.0, grad * scale))


def test_hashed_dropout_keeps_nothing_for_the_backward_but_its_seed() -> None:
    x = torch.randn(HASHED_MIN, requires_grad=True)
    out = dropout(x, 0.5)
    assert out.grad_fn is not None
    saved = [t for t in out.grad_fn.saved_tensors]  # type: ignore[attr-defined]
    assert len(saved) == 1 and saved[0].dim() == 0 and saved[0].dtype == torch.int64


def test_hashed_masks_differ_from_call_to_call_and_small_tensors_keep_torch_words() -> None:
    x = torch.ones(HASHED_MIN)
    assert not torch.equal(dropout(x, 0.5), dropout(x, 0.5))
    assert not _hashed_applies(torch.ones(HASHED_MIN - 1))
    assert not _hashed_applies(torch.ones(HASHED_MIN, dtype=torch.float64))


def test_with_compiling_disallowed_big_dropout_takes_torch_words() -> None:
    x = torch.ones(HASHED_MIN)
    allow(False)
    try:
        assert not _hashed_applies(x)
        torch.manual_seed(3)
        out = dropout(x, 0.3)
    finally:
        allow(True)
    torch.manual_seed(3)
    assert torch.equal(out == 0, drop_mask(x.shape, 0.3))
