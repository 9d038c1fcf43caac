"""The encoder-decoder Transformer for sequence-to-sequence tasks such as translation."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from qkv.model.config import ModelConfig
from qkv.model.decoder import Decoder
from qkv.model.embedding import check_ids, make_embeddings
from qkv.model.encoder import Encoder
from qkv.model.init import xavier_init
from qkv.model.kv_cache import DecoderCache
from qkv.model.maps import AttentionMaps
from qkv.model.masks import decoder_self_mask, padding_mask


class Seq2SeqTransformer(nn.Module):
    """Encoder, decoder and output projection (Figure 1 of the paper).

    With a joint vocabulary and `tie_embeddings`, the source embedding, target embedding and
    output projection share one matrix (section 3.4).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if not isinstance(config, ModelConfig):  # a dict of its fields, say
            raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
        if config.n_decoder_layers < 1:
            raise ValueError("a sequence-to-sequence model needs n_decoder_layers >= 1")
        self.config = config
        c = config
        tie = c.tie_embeddings and c.joint_vocab
        shared = (c.d_model, c.pad_id, c.dropout, c.max_len, c.positions)
        self.encoder = Encoder(c, make_embeddings(c.vocab_size, *shared))
        tied_token = self.encoder.embeddings.token if tie else None
        self.decoder = Decoder(c, make_embeddings(c.target_vocab_size, *shared, tied_token))
        self.output = nn.Linear(c.d_model, c.target_vocab_size, bias=False)
        xavier_init(self, c.pad_id)
        if tie:
            self.output.weight = self.decoder.embeddings.token.table.weight

    def encode(
        self, src_ids: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, Tensor, list[Tensor]]:
        """src_ids (B, S) -> memory (B, S, D), source mask (B, 1, 1, S), encoder maps."""
        check_ids(src_ids, self.config.vocab_size, "source ids")
        src_mask = padding_mask(src_ids, self.config.pad_id)  # (B, 1, 1, S)
        memory, maps = self.encoder(src_ids, src_mask, need_weights)  # (B, S, D)
        return memory, src_mask, maps

    def decode(self, tgt_ids: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """tgt_ids (B, T), memory (B, S, D) -> decoder states (B, T, D)."""
        self._check_targets(tgt_ids, memory)
        self_mask = decoder_self_mask(tgt_ids, self.config.pad_id)  # (B, 1, T, T)
        states, _, _ = self.decoder(tgt_ids, memory, self_mask, src_mask)
        return states

    def hidden(self, src_ids: Tensor, tgt_ids: Tensor) -> Tensor:
        """Decoder states (B, T, D) before the output projection (a loss can project only
        the non-pad rows, which saves the largest matmul on padding)."""
        memory, src_mask, _ = self.encode(src_ids)
        return self.decode(tgt_ids, memory, src_mask)

    def forward(self, src_ids: Tensor, tgt_ids: Tensor) -> Tensor:
        """src_ids (B, S), tgt_ids (B, T) (BOS-prefixed) -> next-token logits (B, T, V)."""
        return self.output(self.hidden(src_ids, tgt_ids))  # (B, T, V)

    def forward_with_maps(self, src_ids: Tensor, tgt_ids: Tensor) -> tuple[Tensor, AttentionMaps]:
        """Logits (B, T, V) and every attention map, from the weights path."""
        memory, src_mask, encoder_maps = self.encode(src_ids, need_weights=True)
        self._check_targets(tgt_ids, memory)
        self_mask = decoder_self_mask(tgt_ids, self.config.pad_id)  # (B, 1, T, T)
        states, self_maps, cross_maps = self.decoder(
            tgt_ids, memory, self_mask, src_mask, need_weights=True
        )
        return self.output(states), AttentionMaps(encoder_maps, self_maps, cross_maps)

    def _check_targets(self, tgt_ids: Tensor, memory: Tensor) -> None:
        check_ids(tgt_ids, self.config.target_vocab_size, "target ids")
        if memory.dim() != 3:
            raise ValueError(f"memory must be (B, S, D), got shape {tuple(memory.shape)}")
        if tgt_ids.size(0) != memory.size(0):
            raise ValueError(
                f"{memory.size(0)} source rows but {tgt_ids.size(0)} target rows: a batch pairs "
                "each source with its target"
            )

    def init_cache(self, memory: Tensor, src_mask: Tensor, max_len: int) -> DecoderCache:
        """A cache for decoding up to `max_len` steps from memory (N, S, D)."""
        return self.decoder.init_cache(memory, src_mask, max_len)

    def decode_step(self, tokens: Tensor, cache: DecoderCache) -> Tensor:
        """tokens (N,), the newest of each row -> next-token logits (N, V)."""
        shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        if shape != (cache.rows,):
            raise ValueError(
                f"tokens must be a tensor of shape ({cache.rows},), the newest token of each "
                f"row of the cache, got {shape}"
            )
        check_ids(tokens[:, None], self.config.target_vocab_size, "tokens")
        states = self.decoder.step(tokens[:, None], cache)[:, 0]  # (N, D)
        return self.output(states)  # (N, V)

    @torch.no_grad()
    def num_parameters(self, trainable_only: bool = True) -> int:
        """Count parameters once each (shared tables count once)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)
