"""A model and its fast twin, and what the tests compare between them."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor, nn

import qkv.fast

M = TypeVar("M", bound=nn.Module)


def fast_twin(model: M, packed: bool = True) -> M:
    """A copy of `model` (its own parameters, the same values) made fast by `qkv.fast.apply`."""
    twin = copy.deepcopy(model)
    qkv.fast.apply(twin, packed=packed)
    return twin


def loss_and_grads(model: nn.Module, loss: Callable[[nn.Module], Tensor]) -> dict[str, Tensor]:
    """The loss and the gradient of every parameter that gets one, by name."""
    model.zero_grad(set_to_none=True)
    value = loss(model)
    value.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return {"loss": value.detach(), **grads}


def assert_all_close(
    got: dict[str, Tensor], expected: dict[str, Tensor], atol: float = 1e-5, rtol: float = 1e-4
) -> None:
    assert got.keys() == expected.keys()
    for name, value in got.items():
        torch.testing.assert_close(value, expected[name], atol=atol, rtol=rtol, msg=name)
