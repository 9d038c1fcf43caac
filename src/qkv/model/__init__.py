"""The network only: no files, no tokenizers, no training.

Shape alphabet used in every shape note of the package:

    B  batch                S  source length        T  target length
    D  d_model              H  attention heads      K  head dim (D / H)
    F  d_ff                 V  vocabulary size      W  beam width
    N  rows fed to an incremental decoder (B, or B * W during beam search)
    C  classes

Masks are boolean with True = may attend (see `masks.py`).
"""

from qkv.model.attention import MultiHeadAttention
from qkv.model.classifier import TextClassifier
from qkv.model.config import ModelConfig
from qkv.model.kv_cache import DecoderCache, KVCache, SourceKV
from qkv.model.maps import AttentionMaps
from qkv.model.seq2seq import Seq2SeqTransformer

__all__ = [
    "AttentionMaps",
    "DecoderCache",
    "KVCache",
    "ModelConfig",
    "MultiHeadAttention",
    "Seq2SeqTransformer",
    "SourceKV",
    "TextClassifier",
]
