"""Tokenized corpora cached as safetensors (flat ids + offsets), so a run tokenizes once."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from qkv.training.checkpoint import save_tensors


def save_id_lists(path: Path, corpora: dict[str, list[list[int]]]) -> None:
    """Write named lists of id sequences atomically."""
    tensors: dict[str, torch.Tensor] = {}
    for name, seqs in corpora.items():
        lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
        flat = np.fromiter((t for s in seqs for t in s), dtype=np.int32, count=int(lengths.sum()))
        tensors[f"{name}.ids"] = torch.from_numpy(flat)
        tensors[f"{name}.lengths"] = torch.from_numpy(lengths)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_tensors(tensors, tmp)
    os.replace(tmp, path)


def load_id_lists(path: Path) -> dict[str, list[list[int]]] | None:
    """Read what `save_id_lists` wrote; None when the cache is missing or unreadable."""
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError):
        return None
    out: dict[str, list[list[int]]] = {}
    for key in tensors:
        if not key.endswith(".ids"):
            continue
        name = key.removesuffix(".ids")
        lengths = tensors.get(f"{name}.lengths")
        if lengths is None or int(lengths.sum()) != tensors[key].numel():
            return None
        flat = tensors[key].tolist()
        ends = np.cumsum(lengths.numpy()).tolist()
        starts = [0, *ends[:-1]]
        out[name] = [flat[a:b] for a, b in zip(starts, ends, strict=True)]
    return out
