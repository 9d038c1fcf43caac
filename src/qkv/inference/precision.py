"""Decoding in bfloat16: `decoding_model(model, bf16=True, device)`, a bf16 copy to decode with.

Every weight, cache and activation is bf16 (the searches still read float32 logits); outputs
can differ from float32 decoding where two candidates score within bf16's rounding.
"""

from __future__ import annotations

import copy
import warnings

import torch

from qkv.errors import ConfigError
from qkv.fast.frozen_linear import cpu_bf16_matmuls
from qkv.model.seq2seq import Seq2SeqTransformer


def decoding_model(
    model: Seq2SeqTransformer, bf16: bool, device: torch.device
) -> Seq2SeqTransformer:
    """The model itself, or with `bf16` a copy of it in bfloat16, to decode with: ConfigError
    on a GPU without bf16, a warning on a CPU without native bf16 (slower than float32)."""
    if not bf16:
        return model
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError("bf16 decoding needs a GPU that supports bfloat16; this one does not")
    if device.type == "cpu" and not cpu_bf16_matmuls():
        warnings.warn(
            "this CPU has no native bfloat16 matrix instructions (AVX512-BF16 or AMX): "
            "bf16 decoding will be slower than float32",
            stacklevel=2,
        )
    return copy.deepcopy(model).to(torch.bfloat16)
