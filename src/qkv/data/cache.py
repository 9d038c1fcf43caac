"""Tokenized corpora cached on disk, so that a run tokenizes once and never holds its corpus
in memory, with a digest of each split's text: a resumed run accepts the same data at a new
place, no other.

The cache is one safetensors file: for each named `TokenArray` ("train.src", ...) a tensor
"NAME.offsets" (n + 1,) int64 and a tensor "NAME.ids" (N,) int32; its metadata holds the
format, each tensor's SHA-256 ("sha256.NAME.ids") and each split's text digest
("digest.train"). It is written in pieces to a temporary directory as the corpus streams,
joined, fsync'ed and renamed into place: a cache that is there is whole.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import numpy as np

from qkv.data.token_array import IDS_DTYPE, OFFSETS_DTYPE, OnDisk, OpenFile, TokenArray
from qkv.errors import DataError
from qkv.training.checkpoint import fsync_dir

CACHE_FILE = Path("cache") / "tokens.safetensors"  # a run's token cache, in its directory
FORMAT = "qkv-token-cache/2"  # metadata "format"; a cache of another format is rebuilt
DIGEST_PREFIX = "digest."  # metadata "digest.train" holds the training text's digest
SHA_PREFIX = "sha256."  # metadata "sha256.train.src.ids" holds that tensor's SHA-256
DTYPES: dict[str, np.dtype] = {"I32": IDS_DTYPE, "I64": OFFSETS_DTYPE}
HEADER_LIMIT = 100 << 20  # a longer header is no cache's
COPY_BYTES = 1 << 20


class StreamDigest:
    """`text_digest` fed a column at a time, each in chunks: its length first, then its items."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._left = 0  # items of the current column still to come

    def column(self, count: int) -> None:
        """Starts a column of `count` items."""
        if self._left:
            raise ValueError(f"the previous column still misses {self._left} items")
        self._hash.update(f"{count};".encode())
        self._left = count

    def update(self, items: Sequence[str]) -> None:
        """The next items of the current column."""
        if len(items) > self._left:
            raise ValueError(f"{len(items)} items for a column with {self._left} to come")
        self._left -= len(items)
        encoded = [item.encode("utf-8", "surrogatepass") for item in items]
        self._hash.update(b"".join(b"%d:%b" % (len(data), data) for data in encoded))

    def hexdigest(self) -> str:
        if self._left:
            raise ValueError(f"the last column still misses {self._left} items")
        return self._hash.hexdigest()


def text_digest(*columns: Sequence[str]) -> str:
    """sha256 of columns of strings (e.g. sources and targets): equal exactly when the
    columns hold the same strings in the same order."""
    digest = StreamDigest()
    for column in columns:
        digest.column(len(column))
        digest.update(column)
    return digest.hexdigest()


@dataclass
class _Piece:
    """One array as it is written: its ids and lengths in files of their own."""

    ids: BinaryIO
    lengths: BinaryIO
    ids_sha: hashlib._Hash
    rows: int = 0
    tokens: int = 0


class TokenCacheWriter:
    """Writes a token cache a chunk at a time (`append`), then whole and atomically (`finish`);
    a writer left without `finish` leaves nothing behind and any older cache as it was."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix=f"{path.name}.", suffix=".tmp", dir=path.parent))
        self.pieces: dict[str, _Piece] = {}

    def __enter__(self) -> TokenCacheWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Removes the pieces (`finish` has taken what it needs)."""
        for piece in self.pieces.values():
            piece.ids.close()
            piece.lengths.close()
        shutil.rmtree(self.work, ignore_errors=True)

    def append(self, name: str, ids: np.ndarray, lengths: np.ndarray) -> None:
        """Adds rows to array `name`: their ids, flat (N,), and their lengths (n,)."""
        if int(lengths.sum()) != len(ids):
            raise ValueError(f"{len(ids)} ids but lengths adding up to {int(lengths.sum())}")
        piece = self.pieces.get(name)
        if piece is None:
            ids_file = open(self.work / f"{name}.ids", "wb")  # noqa: SIM115 (closed by close)
            lengths_file = open(self.work / f"{name}.lengths", "wb")  # noqa: SIM115
            piece = self.pieces[name] = _Piece(ids_file, lengths_file, hashlib.sha256())
        data = np.ascontiguousarray(ids, dtype=IDS_DTYPE).tobytes()
        piece.ids.write(data)
        piece.ids_sha.update(data)
        piece.lengths.write(np.ascontiguousarray(lengths, dtype=OFFSETS_DTYPE).tobytes())
        piece.rows += len(lengths)
        piece.tokens += len(ids)

    def add(self, name: str, sequences: Iterable[Sequence[int]]) -> None:
        """Adds rows held in memory to array `name`."""
        rows = TokenArray.from_lists(sequences)
        self.append(name, rows.ids.read(0, rows.ids.size), rows.lengths)

    def finish(self, digests: dict[str, str]) -> TokenCache:
        """Joins the arrays into the cache file, with the `text_digest` of each split (by
        split name: "train", "train.src", ...), renames it into place and reads it back."""
        tensors: list[tuple[str, str, int, Path]] = []  # name, dtype, entries, file
        shas: dict[str, str] = {}
        for name, piece in self.pieces.items():
            piece.ids.close()
            piece.lengths.close()
            offsets = self.work / f"{name}.offsets"
            shas[f"{name}.offsets"] = _write_offsets(self.work / f"{name}.lengths", offsets)
            shas[f"{name}.ids"] = piece.ids_sha.hexdigest()
            tensors.append((f"{name}.offsets", "I64", piece.rows + 1, offsets))
        for name, piece in self.pieces.items():  # int32 after every int64: all aligned
            tensors.append((f"{name}.ids", "I32", piece.tokens, self.work / f"{name}.ids"))
        header: dict[str, object] = {
            "__metadata__": {
                **{DIGEST_PREFIX + split: value for split, value in digests.items()},
                "format": FORMAT,
                **{SHA_PREFIX + key: value for key, value in shas.items()},
            }
        }
        end = 0
        for key, dtype, entries, _ in tensors:
            size = entries * DTYPES[dtype].itemsize
            header[key] = {"dtype": dtype, "shape": [entries], "data_offsets": [end, end + size]}
            end += size
        encoded = json.dumps(header, separators=(",", ":")).encode()
        encoded += b" " * (-len(encoded) % 8)  # safetensors pads its header to 8 bytes
        joined = self.work / self.path.name
        with joined.open("wb") as out:
            out.write(len(encoded).to_bytes(8, "little") + encoded)
            for *_, part in tensors:
                with part.open("rb") as source:
                    shutil.copyfileobj(source, out, COPY_BYTES)
                part.unlink()
            out.flush()
            os.fsync(out.fileno())
        os.replace(joined, self.path)
        fsync_dir(self.path.parent)
        cache = open_token_cache(self.path, verify=False)
        if cache is None:
            raise DataError(self.path, "the token cache just written cannot be read back")
        return cache


def _write_offsets(lengths_path: Path, offsets_path: Path) -> str:
    """Writes the running sums (n + 1,) of lengths (n,) read from a file; their SHA-256."""
    sha = hashlib.sha256()
    total = 0
    with lengths_path.open("rb") as source, offsets_path.open("wb") as out:
        first = np.zeros(1, OFFSETS_DTYPE).tobytes()
        out.write(first)
        sha.update(first)
        while block := source.read(COPY_BYTES):
            sums = np.cumsum(np.frombuffer(block, OFFSETS_DTYPE)) + total
            total = int(sums[-1])
            data = sums.astype(OFFSETS_DTYPE).tobytes()
            out.write(data)
            sha.update(data)
    lengths_path.unlink()
    return sha.hexdigest()


@dataclass
class TokenCache:
    """A token cache as read: its arrays (rows read from the file as asked for) and metadata."""

    arrays: dict[str, TokenArray]
    metadata: dict[str, str]


def open_token_cache(path: Path, verify: bool = True) -> TokenCache | None:
    """The cache at `path`; None when it is missing, unreadable, of another format, cut short
    or (with `verify`, a pass over the file) not what was written."""
    try:
        file = OpenFile(path)
        header, metadata = _read_header(file)
        if metadata.get("format") != FORMAT:
            return None
        tensors = _tensors(file, header)
        arrays = _arrays(tensors)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if verify and any(_sha256(t) != metadata.get(SHA_PREFIX + k) for k, t in tensors.items()):
        return None
    return TokenCache(arrays, metadata)


def read_metadata(path: Path) -> dict[str, str]:
    """The metadata of the safetensors file at `path` (a cache of any format); {} when it is
    missing or unreadable."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return _read_header(OpenFile(path))[1]
    return {}


def check_same_data(path: Path, texts: dict[str, tuple[Path, str]]) -> None:
    """Refuses text that is not what the cache at `path` (if readable, with digests) was made
    from: `texts` holds, by split name ("train", or "train.src" for one side), the file read
    and the `text_digest` of its text."""
    metadata = read_metadata(path)
    for split, (source, digest) in texts.items():
        cached = metadata.get(DIGEST_PREFIX + split)
        if cached is not None and cached != digest:
            raise DataError(
                source,
                "does not hold the text this run was trained on; a resumed run takes its own "
                "data, at a new place if it moved: to train on other data, start a new run",
            )


def _read_header(file: OpenFile) -> tuple[dict[str, dict[str, object]], dict[str, str]]:
    """A safetensors file's tensor entries and metadata; ValueError if it has none."""
    size = int.from_bytes(file.read(8, 0), "little")
    if not 2 <= size <= HEADER_LIMIT:
        raise ValueError(f"{file.path}: not a safetensors file")
    header = json.loads(file.read(size, 8))
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(header, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError(f"{file.path}: not a safetensors header")
    return header, metadata


def _tensors(file: OpenFile, header: dict[str, dict[str, object]]) -> dict[str, OnDisk]:
    """The header's 1-D tensors on disk; ValueError unless they fill the file exactly."""
    start = 8 + int.from_bytes(file.read(8, 0), "little")
    tensors: dict[str, OnDisk] = {}
    spans: list[tuple[int, int]] = []
    for key, spec in header.items():
        dtype, shape = DTYPES[str(spec["dtype"])], spec["shape"]
        begin, end = (int(x) for x in spec["data_offsets"])  # type: ignore[attr-defined]
        if not isinstance(shape, list) or len(shape) != 1:
            raise ValueError(f"{file.path}: tensor {key} is not 1-D")
        if end - begin != int(shape[0]) * dtype.itemsize:
            raise ValueError(f"{file.path}: tensor {key} does not fit its place")
        tensors[key] = OnDisk(file, start + begin, dtype, int(shape[0]))
        spans.append((begin, end))
    spans.sort()
    if any(a[1] != b[0] for a, b in itertools.pairwise(spans)) or (spans and spans[0][0] != 0):
        raise ValueError(f"{file.path}: tensors overlap or leave gaps")
    if start + (spans[-1][1] if spans else 0) != os.fstat(file.fd).st_size:
        raise ValueError(f"{file.path}: file size does not match its header (cut short?)")
    return tensors


def _arrays(tensors: dict[str, OnDisk]) -> dict[str, TokenArray]:
    """The token arrays of a cache's tensors; ValueError for a pair that does not fit."""
    arrays: dict[str, TokenArray] = {}
    for key, ids in tensors.items():
        if not key.endswith(".ids"):
            continue
        name = key.removesuffix(".ids")
        offsets = tensors[f"{name}.offsets"]
        if ids.dtype != IDS_DTYPE or offsets.dtype != OFFSETS_DTYPE or offsets.size < 1:
            raise ValueError(f"{name}: not a token array")
        first, last = (
            int(offsets.read(0, 1)[0]),
            int(offsets.read(offsets.size - 1, offsets.size)[0]),
        )
        if first != 0 or last != ids.size:
            raise ValueError(f"{name}: offsets do not span the ids")
        arrays[name] = TokenArray(ids, offsets)
    return arrays


def _sha256(tensor: OnDisk) -> str:
    sha = hashlib.sha256()
    item = tensor.dtype.itemsize
    for begin in range(0, tensor.size * item, COPY_BYTES):
        count = min(COPY_BYTES, tensor.size * item - begin)
        sha.update(tensor.file.read(count, tensor.start + begin))
    return sha.hexdigest()
