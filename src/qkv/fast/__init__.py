"""Fast subclasses of the reference modules, swapped into a model in place by `apply`: the same
parameters, state dict and numbers up to float rounding (see `docs/performance.md`)."""

from __future__ import annotations

from torch import nn

from qkv.fast.dropout import Dropout
from qkv.fast.linear import Linear
from qkv.fast.packed import PackedDecoder, PackedEncoder
from qkv.model.decoder import Decoder
from qkv.model.encoder import Encoder

_FAST = {
    Encoder: PackedEncoder,
    Decoder: PackedDecoder,
    nn.Linear: Linear,
    nn.Dropout: Dropout,
}


def apply(model: nn.Module, packed: bool = True) -> nn.Module:
    """Turn every reference module of `model` into its fast subclass, in place; returns it.
    `packed=False` keeps padded batches: no host sync, as a CUDA graph needs."""
    for module in model.modules():
        fast = _FAST.get(type(module))
        if fast is not None:
            module.__class__ = fast
        if isinstance(module, PackedEncoder | PackedDecoder):
            module.packed = packed
    return model


def applied(model: nn.Module) -> bool:
    """Whether `apply` has turned any module of `model` fast (and `reference` not undone it)."""
    kinds = set(_FAST.values())
    return any(type(module) in kinds for module in model.modules())


def reference(model: nn.Module) -> nn.Module:
    """Undo `apply`: every fast module back to its reference class, in place; returns it."""
    back = {fast: plain for plain, fast in _FAST.items()}
    for module in model.modules():
        plain = back.get(type(module))
        if plain is not None:
            module.__class__ = plain
    return model
