"""The encoder stack: embeddings, N encoder layers, and a final norm when pre-norm."""

from __future__ import annotations

from torch import Tensor, nn

from qkv.model.config import ModelConfig
from qkv.model.embedding import Embeddings
from qkv.model.layers import EncoderLayer
from qkv.model.masks import check_mask


class Encoder(nn.Module):
    """N identical layers of self-attention + feed-forward over the embedded source."""

    def __init__(self, config: ModelConfig, embeddings: Embeddings) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.layers = nn.ModuleList(
            EncoderLayer(
                config.d_model,
                config.n_heads,
                config.d_ff,
                config.dropout,
                config.attention_dropout,
                config.activation,
                config.norm_first,
            )
            for _ in range(config.n_encoder_layers)
        )
        self.final_norm = nn.LayerNorm(config.d_model) if config.norm_first else nn.Identity()
        self.pad_id = config.pad_id

    def forward(
        self, ids: Tensor, mask: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, list[Tensor]]:
        """ids (B, S), mask (B, 1, 1, S) -> memory (B, S, D) and per-layer (B, H, S, S) weights
        (empty unless `need_weights`).

        Raises:
            TypeError: if `mask` is not boolean.
        """
        check_mask(mask)
        x = self.embeddings(ids)  # (B, S, D)
        maps: list[Tensor] = []
        for layer in self.layers:
            x, weights = layer(x, mask, need_weights)
            if weights is not None:
                maps.append(weights)
        return self.final_norm(x), maps
