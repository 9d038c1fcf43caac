import pytest
import torch

from qkv.model.dropout import Dropout, drop_mask, dropout


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
