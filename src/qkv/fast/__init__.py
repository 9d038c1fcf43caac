"""Fast subclasses of the reference modules, swapped into a model in place by `apply`.

They keep the parameters and state dict of `qkv.model`'s modules and give the same numbers up
to float rounding (each is tested against the reference; gains in `docs/performance.md`):
`PackedEncoder` / `PackedDecoder` run every layer on the real tokens only (`packed.py`),
`Linear` sends a CPU training step's float32 products to oneDNN (`linear.py`), `Dropout`
hashes its masks in a compiled loop (`dropout.py`) and `FusedFeedForward` makes
Linear -> ReLU -> dropout one step each way (`fused_ffn.py`). Decoding adds
`frozen_for_decoding` (`decoding.py`).
"""

from __future__ import annotations

from torch import nn

from qkv.fast.dropout import Dropout
from qkv.fast.fused_ffn import FusedFeedForward
from qkv.fast.linear import Linear
from qkv.fast.packed import PackedDecoder, PackedEncoder
from qkv.model.decoder import Decoder
from qkv.model.encoder import Encoder
from qkv.model.layers import FeedForward

_FAST = {
    Encoder: PackedEncoder,
    Decoder: PackedDecoder,
    FeedForward: FusedFeedForward,
    nn.Linear: Linear,
    nn.Dropout: Dropout,
}


def apply(model: nn.Module, packed: bool = True) -> nn.Module:
    """Turn every reference module of `model` into its fast subclass, in place; returns it.

    Args:
        model: a `Seq2SeqTransformer` or `TextClassifier` (or any module holding their parts).
        packed: whether the encoder and decoder run on the real tokens only. False keeps every
            shape a function of the batch's shape, with no host sync, as a CUDA graph needs.
    """
    for module in model.modules():
        fast = _FAST.get(type(module))
        if fast is not None:
            module.__class__ = fast
        if isinstance(module, PackedEncoder | PackedDecoder):
            module.packed = packed
    return model


def reference(model: nn.Module) -> nn.Module:
    """Undo `apply`: every fast module back to its reference class, in place; returns it."""
    back = {fast: plain for plain, fast in _FAST.items()}
    for module in model.modules():
        plain = back.get(type(module))
        if plain is not None:
            module.__class__ = plain
    return model
