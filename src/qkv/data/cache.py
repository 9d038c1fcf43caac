"""Tokenized corpora cached as safetensors (flat ids + lengths), so a run tokenizes once, with
a digest of each split's text: a resumed run accepts the same data at a new place, no other.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from qkv.errors import DataError
from qkv.training.checkpoint import replacing, save_tensors

DIGEST_PREFIX = "digest."  # metadata "digest.train" holds the training text's digest


def text_digest(*columns: Sequence[str]) -> str:
    """sha256 of columns of strings (e.g. sources and targets): equal exactly when the
    columns hold the same strings in the same order."""
    digest = hashlib.sha256()
    for column in columns:
        digest.update(f"{len(column)};".encode())
        for item in column:
            data = item.encode("utf-8", "surrogatepass")
            digest.update(f"{len(data)}:".encode())
            digest.update(data)
    return digest.hexdigest()


def save_id_lists(
    path: Path, corpora: dict[str, list[list[int]]], digests: dict[str, str] | None = None
) -> None:
    """Writes named lists of id sequences atomically, with `digests` (each split's
    `text_digest`, by split name) in the file's metadata."""
    tensors: dict[str, torch.Tensor] = {}
    for name, seqs in corpora.items():
        lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
        flat = np.fromiter((t for s in seqs for t in s), dtype=np.int32, count=int(lengths.sum()))
        tensors[f"{name}.ids"] = torch.from_numpy(flat)
        tensors[f"{name}.lengths"] = torch.from_numpy(lengths)
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {DIGEST_PREFIX + split: value for split, value in (digests or {}).items()}
    with replacing(path) as tmp:
        save_tensors(tensors, tmp, metadata)


def load_id_lists(path: Path) -> dict[str, list[list[int]]] | None:
    """Reads what `save_id_lists` wrote; None when the cache is missing or unreadable."""
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError):
        return None
    out: dict[str, list[list[int]]] = {}
    for name in [key.removesuffix(".ids") for key in tensors if key.endswith(".ids")]:
        ids, lengths = tensors[f"{name}.ids"], tensors.get(f"{name}.lengths")
        if lengths is None or int(lengths.sum()) != ids.numel():
            return None
        flat = ids.tolist()
        ends = np.cumsum(lengths.numpy()).tolist()
        starts = [0, *ends[:-1]]
        out[name] = [flat[a:b] for a, b in zip(starts, ends, strict=True)]
    return out


def check_same_data(path: Path, texts: dict[str, tuple[Path, str]]) -> None:
    """Refuses text that is not what the cache at `path` (if readable, with digests) was made
    from: `texts` holds, by split name ("train", or "train.src" for one side), the file read
    and the `text_digest` of its text."""
    try:
        with safe_open(str(path), "pt") as cache:
            metadata = cache.metadata() or {}
    except (SafetensorError, OSError, ValueError):
        return
    for split, (source, digest) in texts.items():
        cached = metadata.get(DIGEST_PREFIX + split)
        if cached is not None and cached != digest:
            raise DataError(
                source,
                "does not hold the text this run was trained on; a resumed run takes its own "
                "data, at a new place if it moved: to train on other data, start a new run",
            )
