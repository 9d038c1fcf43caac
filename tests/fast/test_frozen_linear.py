from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import qkv.fast
from qkv.fast.frozen_linear import (
    MIN_ROWS,
    ROWS_HINT,
    FrozenLinear,
    cpu_bf16_matmuls,
    frozen_copy,
)
from qkv.fast.linear import Linear
from qkv.model.seq2seq import Seq2SeqTransformer
from tests.model.helpers import random_ids, tiny_config


@pytest.mark.parametrize(("rows", "bias"), [(64, True), (320, False), (1, True)])
def test_frozen_linear_equals_the_layer(rows: int, bias: bool) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(32, 300, bias=bias)
    frozen = FrozenLinear(layer)
    x = torch.randn(rows, 32)
    with torch.inference_mode():
        out = frozen(x)
        assert out.shape == (rows, 300)
        torch.testing.assert_close(out, layer(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_a_part_of_a_frozen_linear_equals_those_rows_of_the_layer(bias: bool) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(32, 96, bias=bias)
    frozen = FrozenLinear(layer)
    x = torch.randn(2, 8, 32)
    with torch.inference_mode():
        part = frozen.part(32, 64)
        assert frozen.part(32, 64) is part  # made once
        torch.testing.assert_close(part(x), layer(x)[..., 32:64], rtol=1e-5, atol=1e-5)
        assert frozen.blocked is None  # the whole layer was never called
    assert part.weight.data_ptr() == layer.weight[32].data_ptr()  # a view, not a copy


def test_frozen_linear_keeps_the_graph_when_gradients_are_on() -> None:
    layer = nn.Linear(8, 4)
    out = FrozenLinear(layer)(torch.randn(2, 8))
    out.sum().backward()
    assert layer.weight.grad is not None


def test_frozen_linear_serves_other_dtypes_with_the_layer() -> None:
    layer = nn.Linear(8, 4).to(torch.float16)
    x = torch.randn(3, 8, dtype=torch.float16)
    with torch.inference_mode():
        frozen = FrozenLinear(layer)
        assert torch.equal(frozen(x), layer(x)) and frozen.blocked is None


def test_frozen_linear_in_bf16_where_native(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(32, 300).to(torch.bfloat16)
    x = torch.randn(64, 32, dtype=torch.bfloat16)
    with torch.inference_mode():
        frozen = FrozenLinear(layer)
        native = cpu_bf16_matmuls()
        assert frozen.blocked is None  # reordered at the first call
        torch.testing.assert_close(frozen(x).float(), layer(x).float(), rtol=1e-2, atol=1e-2)
        assert (frozen.blocked is not None) == (native and torch.backends.mkldnn.is_available())
        monkeypatch.setattr(qkv.fast.frozen_linear, "cpu_bf16_matmuls", lambda: False)
        other = FrozenLinear(layer)
        other(x)
        assert other.blocked is None  # no native bf16: the layer as it is


def test_bf16_products_need_the_instructions_and_a_right_onednn_product(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from qkv.fast import frozen_linear, linear

    def failing(*args: object) -> None:
        raise RuntimeError("no bf16 here")

    monkeypatch.setattr(frozen_linear, "onednn_available", lambda: True)
    for instructions, product, native in [
        (False, linear.onednn_linear, False),
        (True, failing, False),
        (True, lambda x, w: torch.zeros(8, 3, dtype=torch.bfloat16), False),
        (True, lambda x, w: torch.nn.functional.linear(x, w), True),
    ]:
        monkeypatch.setattr(frozen_linear, "_bf16_instructions", lambda found=instructions: found)
        monkeypatch.setattr(linear, "onednn_linear", product)
        frozen_linear.cpu_bf16_matmuls.cache_clear()
        assert frozen_linear.cpu_bf16_matmuls() is native
    frozen_linear.cpu_bf16_matmuls.cache_clear()


def test_frozen_linear_reorders_at_its_first_call_only(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    reorder = torch.ops.mkldnn._reorder_linear_weight

    def counted(weight: torch.Tensor, rows: int) -> torch.Tensor:
        calls.append(rows)
        return reorder(weight, rows)

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", counted)
    layer, x = nn.Linear(16, 24), torch.randn(2, MIN_ROWS // 2, 16)
    frozen = FrozenLinear(layer)
    assert calls == []
    with torch.inference_mode():
        for _ in range(3):
            torch.testing.assert_close(frozen(x), layer(x), rtol=1e-5, atol=1e-5)
    assert calls == ([ROWS_HINT] if torch.backends.mkldnn.is_available() else [])
    frozen(x)  # under autograd: the layer itself, nothing reordered
    assert len(calls) <= 1


def test_frozen_linear_multiplies_fewer_rows_with_the_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Below `MIN_ROWS` rows a call the layer's own product is faster: nothing is reordered."""

    def refused(*args: object) -> None:
        raise AssertionError("reordered for a call of too few rows")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refused)
    layer = nn.Linear(16, 24)
    frozen = FrozenLinear(layer)
    with torch.inference_mode():
        for rows in range(1, MIN_ROWS):
            x = torch.randn(rows, 1, 16)
            torch.testing.assert_close(frozen(x), layer(x), rtol=1e-5, atol=1e-5)
            out = frozen(x, relu=True)
            torch.testing.assert_close(out, torch.relu(layer(x)), rtol=1e-5, atol=1e-5)
    assert frozen.blocked is None


def _layers(module: nn.Module, kind: type[nn.Module]) -> list[str]:
    return [name for name, child in module.named_modules() if type(child) is kind]


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("rows", [3, 70])
def test_frozen_copy_of_a_decoder_decodes_as_the_decoder(norm_first: bool, rows: int) -> None:
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(norm_first=norm_first)).eval()
    src, tgt = random_ids(rows, 6), random_ids(rows, 5)
    src[1, 4:] = 0
    with torch.inference_mode():
        frozen = frozen_copy(model.decoder)
        memory, src_mask, _ = model.encode(src)
        caches = [model.init_cache(memory, src_mask, max_len=5) for _ in range(2)]
        for t in range(5):
            expected = model.decoder.step(tgt[:, t : t + 1], caches[0])  # (N, 1, D)
            found = frozen.step(tgt[:, t : t + 1], caches[1])  # (N, 1, D)
            torch.testing.assert_close(found, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fast", [False, True], ids=["reference", "fast"])
def test_frozen_copy_shares_the_parameters_and_leaves_the_module_as_it_was(fast: bool) -> None:
    model = Seq2SeqTransformer(tiny_config()).eval()
    if fast:
        qkv.fast.apply(model)
    kind = Linear if fast else nn.Linear
    decoder = model.decoder
    linears = _layers(decoder, kind)
    assert len(linears) == 2 * 6  # per layer: two attentions' in_proj and out_proj, two in the FFN
    frozen = frozen_copy(decoder)
    assert _layers(frozen, FrozenLinear) == linears
    assert _layers(frozen, kind) == [f"{name}.linear" for name in linears]
    assert _layers(decoder, kind) == linears and not _layers(decoder, FrozenLinear)
    assert [id(p) for p in frozen.parameters()] == [id(p) for p in decoder.parameters()]
    assert frozen.training is decoder.training is False


@pytest.mark.parametrize("rows", [64, 3])
def test_frozen_linear_with_relu_equals_the_layer_then_relu(rows: int) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(32, 300)
    frozen = FrozenLinear(layer)
    x = torch.randn(rows, 1, 32)
    with torch.inference_mode():
        out = frozen(x, relu=True)
        torch.testing.assert_close(out, torch.relu(layer(x)), rtol=1e-5, atol=1e-5)
        assert bool((out == 0).any()) and bool((out >= 0).all())
    with_autograd = FrozenLinear(layer)(x, relu=True)  # the unfrozen way
    torch.testing.assert_close(with_autograd, torch.relu(layer(x)), rtol=1e-5, atol=1e-5)


def _no_reorder_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(*args: object) -> None:
        raise AttributeError("no such operator")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", missing)


def _no_linear_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(qkv.fast.frozen_linear, "onednn_available", lambda: False)


@pytest.mark.parametrize(
    "missing",
    [_no_reorder_operator, _no_linear_operator],
    ids=["without-the-reorder-operator", "without-onednns-linear-operator"],
)
def test_frozen_linear_falls_back_to_the_layer(
    monkeypatch: pytest.MonkeyPatch, missing: Callable[[pytest.MonkeyPatch], None]
) -> None:
    """The fallbacks where this torch lacks one of oneDNN's private operators."""
    missing(monkeypatch)
    torch.manual_seed(0)
    layer = nn.Linear(16, 12)
    frozen = FrozenLinear(layer)
    x = torch.randn(8, 16)
    with torch.no_grad():
        torch.testing.assert_close(frozen(x), layer(x))
        torch.testing.assert_close(frozen(x, relu=True), torch.relu(layer(x)))
    assert frozen.blocked is None and not frozen.reorders
