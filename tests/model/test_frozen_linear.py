from __future__ import annotations

import pytest
import torch
from torch import nn

from qkv.model.frozen_linear import FrozenLinear


@pytest.mark.parametrize(("rows", "bias"), [(64, True), (320, False), (1, True)])
def test_frozen_linear_equals_the_layer(rows: int, bias: bool) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(32, 300, bias=bias)
    frozen = FrozenLinear(layer, rows)
    x = torch.randn(rows, 32)
    with torch.inference_mode():
        out = frozen(x)
        assert out.shape == (rows, 300)
        torch.testing.assert_close(out, layer(x), rtol=1e-5, atol=1e-5)


def test_frozen_linear_keeps_the_graph_when_gradients_are_on() -> None:
    layer = nn.Linear(8, 4)
    out = FrozenLinear(layer, 2)(torch.randn(2, 8))
    out.sum().backward()
    assert layer.weight.grad is not None


def test_frozen_linear_serves_other_dtypes_with_the_layer() -> None:
    layer = nn.Linear(8, 4).to(torch.float16)
    x = torch.randn(3, 8, dtype=torch.float16)
    with torch.inference_mode():
        frozen = FrozenLinear(layer, 3)
        assert frozen.blocked is None and torch.equal(frozen(x), layer(x))


def test_frozen_linear_in_bf16_where_native(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(32, 300).to(torch.bfloat16)
    x = torch.randn(64, 32, dtype=torch.bfloat16)
    with torch.inference_mode():
        frozen = FrozenLinear(layer, 64)
        native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        assert (frozen.blocked is not None) == (native and torch.backends.mkldnn.is_available())
        torch.testing.assert_close(frozen(x).float(), layer(x).float(), rtol=1e-2, atol=1e-2)
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
        assert FrozenLinear(layer, 64).blocked is None  # no native bf16: the layer as it is
