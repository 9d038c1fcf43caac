"""A Transformer encoder text classifier: embed, self-attend, pool, dropout, classify."""

from __future__ import annotations

from torch import Tensor, nn

from qkv.model.config import ModelConfig
from qkv.model.embedding import check_ids, make_embeddings
from qkv.model.encoder import Encoder
from qkv.model.init import xavier_init
from qkv.model.maps import AttentionMaps
from qkv.model.masks import padding_mask


class TextClassifier(nn.Module):
    """Encoder + pooling + dropout + linear head. Pooling is the mean over the real tokens, or
    with `pooling="cls"` the first position, where the caller puts a [CLS] token (the training
    data and `qkv.inference.Classifier` do)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if not isinstance(config, ModelConfig):  # a dict of its fields, say
            raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
        if config.n_classes < 2:
            raise ValueError(f"a classifier needs n_classes >= 2, got {config.n_classes}")
        self.config = config
        c = config
        self.encoder = Encoder(
            c, make_embeddings(c.vocab_size, c.d_model, c.pad_id, c.dropout, c.max_len, c.positions)
        )
        self.dropout = nn.Dropout(c.head_dropout)
        self.head = nn.Linear(c.d_model, c.n_classes)
        xavier_init(self, c.pad_id)

    def pool(self, states: Tensor, mask: Tensor) -> Tensor:
        """states (B, S, D), mask (B, 1, 1, S) -> (B, D)."""
        if self.config.pooling == "cls":
            return states[:, 0]  # (B, D)
        weights = mask[:, 0, 0, :, None].to(states.dtype)  # (B, S, 1)
        return (states * weights).sum(1) / weights.sum(1).clamp(min=1.0)  # (B, D)

    def forward(self, ids: Tensor) -> Tensor:
        """ids (B, S) -> class logits (B, C)."""
        check_ids(ids, self.config.vocab_size, "token ids")
        mask = padding_mask(ids, self.config.pad_id)  # (B, 1, 1, S)
        states, _ = self.encoder(ids, mask)  # (B, S, D)
        return self.head(self.dropout(self.pool(states, mask)))  # (B, C)

    def forward_with_maps(self, ids: Tensor) -> tuple[Tensor, AttentionMaps]:
        """Logits (B, C) and the encoder's attention maps, from the weights path."""
        check_ids(ids, self.config.vocab_size, "token ids")
        mask = padding_mask(ids, self.config.pad_id)
        states, maps = self.encoder(ids, mask, need_weights=True)
        return self.head(self.dropout(self.pool(states, mask))), AttentionMaps(encoder_self=maps)
