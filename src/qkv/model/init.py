"""Weight initialisation shared by the models."""

from __future__ import annotations

import torch
from torch import nn


def xavier_init(module: nn.Module, pad_id: int) -> None:
    """Xavier-uniform for every matrix, zeros for biases, a zero vector for the padding token."""
    for name, param in module.named_parameters():
        if param.dim() > 1:
            nn.init.xavier_uniform_(param)
        elif name.endswith("bias"):
            nn.init.zeros_(param)
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, nn.Embedding) and sub.padding_idx is not None:
                sub.weight[pad_id].zero_()
