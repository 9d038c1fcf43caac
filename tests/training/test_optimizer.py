"""AdamW with the fused kernel: the same updates as the `foreach` path, and a resumable state."""

from __future__ import annotations

import torch
from torch import nn

from qkv.training.optimizer import adamw

CPU = torch.device("cpu")


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def _train(net: nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(32, 8, generator=generator)
        y = torch.randn(32, 3, generator=generator)
        loss = nn.functional.mse_loss(net(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def test_fused_on_cpu_and_foreach_elsewhere() -> None:
    net = _net(0)
    on_cpu = adamw(net.parameters(), CPU, lr=1e-3, betas=(0.9, 0.98))
    assert on_cpu.param_groups[0]["fused"] is True
    assert not on_cpu.param_groups[0]["foreach"]
    elsewhere = adamw(net.parameters(), torch.device("meta"), lr=1e-3, betas=(0.9, 0.98))
    assert elsewhere.param_groups[0]["foreach"] is True
    assert not elsewhere.param_groups[0]["fused"]


def test_fused_steps_match_the_foreach_path() -> None:
    fused_net, reference_net = _net(1), _net(1)
    fused = adamw(fused_net.parameters(), CPU, lr=1e-2, betas=(0.9, 0.98), weight_decay=0.01)
    reference = torch.optim.AdamW(
        reference_net.parameters(), lr=1e-2, betas=(0.9, 0.98), weight_decay=0.01, foreach=True
    )
    _train(fused_net, fused, steps=20, seed=2)
    _train(reference_net, reference, steps=20, seed=2)
    start = _net(1).parameters()
    for a, b, before in zip(fused_net.parameters(), reference_net.parameters(), start, strict=True):
        assert (a - before).abs().max() > 1e-2  # the steps moved every parameter
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_saved_state_resumes_the_same_updates() -> None:
    """Training 5 + 5 steps through a state-dict round trip equals 10 steps straight."""
    straight_net = _net(3)
    straight = adamw(straight_net.parameters(), CPU, lr=1e-2, betas=(0.9, 0.98))
    _train(straight_net, straight, steps=5, seed=4)
    _train(straight_net, straight, steps=5, seed=5)

    first_net = _net(3)
    first = adamw(first_net.parameters(), CPU, lr=1e-2, betas=(0.9, 0.98))
    _train(first_net, first, steps=5, seed=4)
    resumed_net = _net(99)
    resumed_net.load_state_dict(first_net.state_dict())
    resumed = adamw(resumed_net.parameters(), CPU, lr=0.5, betas=(0.5, 0.5))
    resumed.load_state_dict(first.state_dict())
    assert resumed.param_groups[0]["fused"] is True
    _train(resumed_net, resumed, steps=5, seed=5)
    for a, b in zip(resumed_net.parameters(), straight_net.parameters(), strict=True):
        assert torch.equal(a, b)
