"""Speed, applied to a reference model from outside in one call.

`qkv.model` is the reference network in public PyTorch. `apply(model)` turns a model into its
fast form in place: the same parameters, the same state dict, the same numbers up to float
rounding (each path is tested equal to the reference), listed with its measured gain in
`docs/performance.md`:

- `PackedEncoder` / `PackedDecoder` (`packed.py`): every layer on the real tokens only;
  attention from packed rows to packed rows (`packed_attention.py`);
- `Linear` (`linear.py`): float32 products of a CPU training step through oneDNN;
- `Dropout` (`dropout.py`): cheap masks, hashed in a compiled loop;
- `FusedFeedForward` (`fused_ffn.py`): Linear -> ReLU -> dropout as one step each way.

Decoding adds `frozen_for_decoding` (`decoding.py`: reordered weights, attention over the cache
as two products) and the output layer's screened argmax (`qkv.inference.output_layer`).
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
            shape a function of the batch's shape, with no host sync (what a training step
            recorded as a CUDA graph needs).
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
