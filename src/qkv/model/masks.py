"""Attention masks, built here and nowhere else.

One convention for the whole package: boolean, True = may attend. Padding masks broadcast over
heads and queries, causal masks over batch and heads, and the two combine with `&`. This is the
form `torch.nn.functional.scaled_dot_product_attention` takes.
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """Mask out padding keys.

    Args:
        ids: token ids (B, S).
        pad_id: the padding id.

    Returns:
        (B, 1, 1, S) bool, True where the key is a real token.
    """
    return (ids != pad_id)[:, None, None, :]  # (B, 1, 1, S)


def causal_mask(length: int, device: torch.device | None = None) -> Tensor:
    """Mask out future positions ("subsequent" mask of the decoder).

    Returns:
        (1, 1, T, T) bool, True on and below the diagonal.
    """
    ones = torch.ones(length, length, dtype=torch.bool, device=device)
    return torch.tril(ones)[None, None]  # (1, 1, T, T)


def decoder_self_mask(tgt_ids: Tensor, pad_id: int) -> Tensor:
    """Causal mask combined with the target padding mask.

    Returns:
        (B, 1, T, T) bool.
    """
    return padding_mask(tgt_ids, pad_id) & causal_mask(tgt_ids.size(1), tgt_ids.device)


def check_mask(
    mask: Tensor | None, name: str = "mask", shape: tuple[int, int, int, int] | None = None
) -> None:
    """Refuse a non-boolean mask: the fused kernel adds a float mask of 0s and 1s to the scores,
    and so silently attends where it should not. Given the scores' `shape` (B, H, T, S), refuse
    a mask that does not broadcast to it as (B, 1, 1, S) and (B, 1, T, S) do.

    Raises:
        TypeError: if `mask` is not None and not of dtype torch.bool.
        ValueError: if `mask` does not broadcast to `shape`.
    """
    if mask is None:
        return
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{name} must be boolean (True = may attend), got {mask.dtype}; "
            "see qkv.model.masks for how to build one"
        )
    if shape is not None and (
        mask.dim() != 4 or any(m not in (1, n) for m, n in zip(mask.shape, shape, strict=True))
    ):
        raise ValueError(
            f"{name} must broadcast to (B, H, T, S) = {shape}, as (B, 1, 1, S) or (B, 1, T, S) "
            f"do; got {tuple(mask.shape)}"
        )
