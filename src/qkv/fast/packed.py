"""The encoder and decoder run on the M real tokens only, as (M, D) rows; attention maps, cached
decoding and `packed=False` take the reference path.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import torch.nn.functional as F
from torch import Tensor

from qkv.fast.linear import linear
from qkv.fast.packed_attention import packed_attention, packed_attention_applies
from qkv.fast.packing import Packing
from qkv.model.attention import MultiHeadAttention
from qkv.model.decoder import Decoder
from qkv.model.embedding import Embeddings
from qkv.model.encoder import Encoder
from qkv.model.layers import DecoderLayer, EncoderLayer
from qkv.model.masks import check_mask


class PackedEncoder(Encoder):
    """`Encoder` whose layers run on the real source tokens only."""

    packed = True

    def forward(
        self, ids: Tensor, mask: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, list[Tensor]]:
        """As `Encoder.forward`; the memory is zero at padding."""
        if need_weights or not self.packed:
            return super().forward(ids, mask, need_weights)
        check_mask(mask)
        rows = Packing.from_mask(ids != self.pad_id, round_rows=ids.device.type == "cpu")
        x = embed(self.embeddings, ids, rows)  # (M, D)
        for layer in cast(Iterable[EncoderLayer], self.layers):
            x = encoder_layer(layer, x, mask, rows)  # (M, D)
        return rows.unpack(self.final_norm(x)), []  # (B, S, D)


class PackedDecoder(Decoder):
    """`Decoder` whose layers run on the real target and source tokens only."""

    packed = True

    def forward(
        self,
        ids: Tensor,
        memory: Tensor,
        self_mask: Tensor,
        cross_mask: Tensor,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """As `Decoder.forward`; the states are zero at padding."""
        if need_weights or not self.packed:
            return super().forward(ids, memory, self_mask, cross_mask, need_weights)
        check_mask(self_mask, "self_mask")
        check_mask(cross_mask, "cross_mask")
        batch, source_length = memory.shape[:2]
        on_cpu = ids.device.type == "cpu"  # rows rounded for the CPU's linear layers
        rows = Packing.from_mask(ids != self.pad_id, round_rows=on_cpu)
        source_real = cross_mask.expand(batch, 1, 1, source_length)[:, 0, 0]  # (B, S)
        memory_rows = Packing.from_mask(source_real, round_rows=on_cpu)
        memory = memory_rows.pack(memory)  # (M', D)
        x = embed(self.embeddings, ids, rows)  # (M, D)
        for layer in cast(Iterable[DecoderLayer], self.layers):
            x = decoder_layer(layer, x, memory, self_mask, cross_mask, rows, memory_rows)
        return rows.unpack(self.final_norm(x)), [], []  # (B, T, D)


def embed(embeddings: Embeddings, ids: Tensor, rows: Packing) -> Tensor:
    """The embedded real tokens only: ids (B, L) -> (M, D), placed by `rows`."""
    embeddings.check_length(ids.size(1))
    tokens = embeddings.token(rows.pack(ids))  # (M, D)
    positions = embeddings.positions(ids.size(1))[rows.positions]  # (M, D)
    return embeddings.dropout(tokens + positions)  # (M, D)


def encoder_layer(layer: EncoderLayer, x: Tensor, mask: Tensor, rows: Packing) -> Tensor:
    """`EncoderLayer.forward` on packed rows x (M, D) -> (M, D)."""
    if layer.norm_first:
        x = x + layer.dropout(attention(layer.self_attn, layer.self_attn_norm(x), None, mask, rows))
        return x + layer.dropout(layer.ffn(layer.ffn_norm(x)))
    x = layer.self_attn_norm(x + layer.dropout(attention(layer.self_attn, x, None, mask, rows)))
    return layer.ffn_norm(x + layer.dropout(layer.ffn(x)))


def decoder_layer(
    layer: DecoderLayer,
    x: Tensor,
    memory: Tensor,
    self_mask: Tensor,
    cross_mask: Tensor,
    rows: Packing,
    memory_rows: Packing,
) -> Tensor:
    """`DecoderLayer.forward` on packed rows x (M, D) and memory (M', D) -> (M, D)."""

    def cross(h: Tensor) -> Tensor:
        return attention(layer.cross_attn, h, memory, cross_mask, rows, memory_rows)

    if layer.norm_first:
        h = layer.self_attn_norm(x)
        x = x + layer.dropout(attention(layer.self_attn, h, None, self_mask, rows))
        x = x + layer.dropout(cross(layer.cross_attn_norm(x)))
        return x + layer.dropout(layer.ffn(layer.ffn_norm(x)))
    x = layer.self_attn_norm(
        x + layer.dropout(attention(layer.self_attn, x, None, self_mask, rows))
    )
    x = layer.cross_attn_norm(x + layer.dropout(cross(x)))
    return layer.ffn_norm(x + layer.dropout(layer.ffn(x)))


def attention(
    attn: MultiHeadAttention,
    query: Tensor,
    memory: Tensor | None,
    mask: Tensor | None,
    query_rows: Packing,
    memory_rows: Packing | None = None,
) -> Tensor:
    """`MultiHeadAttention.forward` on packed rows: query (M, D) attends to itself (memory
    None) or to memory (M', D) -> (M, D)."""
    memory_rows = memory_rows or query_rows
    dropout_p = attn.dropout if attn.training else 0.0
    longest = max(query_rows.length, memory_rows.length)
    weight, bias, width = attn.in_proj.weight, attn.in_proj.bias, attn.d_model

    def project(x: Tensor, first: int, last: int) -> Tensor:
        part = None if bias is None else bias[first * width : last * width]
        return linear(x, weight[first * width : last * width], part)  # (M, (last - first) D)

    if memory is None:
        queries, keys_values = attn.in_proj(query), None  # [q; k; v] (M, 3D)
    else:
        queries, keys_values = project(query, 0, 1), project(memory, 1, 3)  # (M, D), (M', 2D)
    if packed_attention_applies(query, dropout_p, longest):
        context = packed_attention(
            queries, keys_values, mask, query_rows, memory_rows, attn.n_heads
        )
        return attn.out_proj(context)  # (M, D)
    q = attn.split_heads(query_rows.unpack(queries))  # (B, 3H, T, K), or (B, H, T, K)
    if keys_values is None:
        q, k, v = q.chunk(3, dim=1)  # (B, H, T, K) each
    else:
        k, v = attn.split_heads(memory_rows.unpack(keys_values)).chunk(2, dim=1)  # (B, H, S, K)
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    return attn.out_proj(query_rows.pack(attn.merge_heads(context)))  # (M, D)
