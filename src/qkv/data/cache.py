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
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import numpy as np
from safetensors import SafetensorError, safe_open

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


class _Digest(Protocol):
    """What `hashlib.sha256()` returns, as far as a part uses it (hashlib names no public type)."""

    def update(self, data: bytes, /) -> None: ...
    def hexdigest(self) -> str: ...


@dataclass
class _Part:
    """One tensor as it is written: a file of its own, its SHA-256 and its number of entries."""

    file: BinaryIO
    dtype: str  # "I64" or "I32", as safetensors names it
    sha: _Digest = field(default_factory=hashlib.sha256)
    entries: int = 0

    def write(self, values: np.ndarray) -> None:
        data = np.ascontiguousarray(values, dtype=DTYPES[self.dtype]).tobytes()
        self.file.write(data)
        self.sha.update(data)
        self.entries += len(values)


class TokenCacheWriter(contextlib.ExitStack):
    """Writes a token cache a chunk at a time (`append`), then whole and atomically (`finish`);
    a writer closed without `finish` leaves nothing behind and any older cache as it was."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        for left in path.parent.glob(f"{path.name}.*.tmp"):  # by a build that was killed
            shutil.rmtree(left, ignore_errors=True)
        self.work = Path(tempfile.mkdtemp(prefix=f"{path.name}.", suffix=".tmp", dir=path.parent))
        self.callback(shutil.rmtree, self.work, ignore_errors=True)  # once the parts are closed
        self.parts: dict[str, _Part] = {}  # by tensor: "train.src.offsets", "train.src.ids"

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        super().__exit__(kind, error, traceback)  # the parts removed
        if isinstance(error, OSError) and error.filename is None:  # a full disk, say
            raise DataError(self.path, f"cannot write ({error.strerror or error})") from None

    def append(self, name: str, ids: np.ndarray, lengths: np.ndarray) -> None:
        """Adds rows to array `name`: their ids, flat (N,), and their lengths (n,)."""
        if int(lengths.sum()) != len(ids):
            raise ValueError(f"{len(ids)} ids but lengths adding up to {int(lengths.sum())}")
        if f"{name}.ids" not in self.parts:
            for key, dtype in ((f"{name}.offsets", "I64"), (f"{name}.ids", "I32")):
                file = self.enter_context(open(self.work / key, "wb"))  # noqa: SIM115
                self.parts[key] = _Part(file, dtype)
            self.parts[f"{name}.offsets"].write(np.zeros(1))
        offsets, tokens = self.parts[f"{name}.offsets"], self.parts[f"{name}.ids"]
        offsets.write(np.cumsum(lengths, dtype=OFFSETS_DTYPE) + tokens.entries)
        tokens.write(ids)

    def add(self, name: str, sequences: Iterable[Sequence[int]]) -> None:
        """Adds rows held in memory to array `name`."""
        rows = TokenArray.from_lists(sequences)
        self.append(name, rows.flat(), rows.lengths)

    def finish(self, digests: dict[str, str]) -> TokenCache:
        """Joins the arrays into the cache file, with the `text_digest` of each split (by
        split name: "train", "train.src", ...), renames it into place and reads it back."""
        for part in self.parts.values():
            part.file.close()
        metadata = {
            **{DIGEST_PREFIX + split: value for split, value in digests.items()},
            "format": FORMAT,
            **{SHA_PREFIX + key: part.sha.hexdigest() for key, part in self.parts.items()},
        }
        # Every int64 tensor before the int32 ones: each is aligned to its entries.
        parts = sorted(self.parts.items(), key=lambda item: item[1].dtype != "I64")
        header: dict[str, object] = {"__metadata__": metadata}
        end = 0
        for key, part in parts:
            size = part.entries * DTYPES[part.dtype].itemsize
            shape = [part.entries]
            header[key] = {"dtype": part.dtype, "shape": shape, "data_offsets": [end, end + size]}
            end += size
        encoded = json.dumps(header, separators=(",", ":")).encode()
        encoded += b" " * (-len(encoded) % 8)  # safetensors pads its header to 8 bytes
        joined = self.work / self.path.name
        with joined.open("wb") as out:
            out.write(len(encoded).to_bytes(8, "little") + encoded)
            for key, _ in parts:
                with (self.work / key).open("rb") as source:
                    shutil.copyfileobj(source, out, COPY_BYTES)
                (self.work / key).unlink()  # the disk holds the corpus once, not twice
            out.flush()
            os.fsync(out.fileno())
        os.replace(joined, self.path)
        fsync_dir(self.path.parent)
        cache = open_token_cache(self.path, verify=False)
        if cache is None:
            raise DataError(self.path, "the token cache just written cannot be read back")
        return cache


@dataclass
class TokenCache:
    """A token cache as read: its arrays (rows read from the file as asked for) and metadata."""

    arrays: dict[str, TokenArray]
    metadata: dict[str, str]


def open_token_cache(path: Path, verify: bool = True) -> TokenCache | None:
    """The cache at `path`; None when it is missing, unreadable, of another format, cut short
    or (with `verify`, a pass over the file) not what was written."""
    try:
        with safe_open(str(path), "numpy"):  # checks that the tensors fill the file, no more
            pass
        file = OpenFile(path)
        header, metadata = _read_header(file)
        if metadata.get("format") != FORMAT:
            return None
        start = 8 + int.from_bytes(file.read(8, 0), "little")
        tensors: dict[str, OnDisk] = {}
        for key, spec in header.items():
            (size,) = spec["shape"]  # a ValueError unless 1-D
            begin = start + spec["data_offsets"][0]
            tensors[key] = OnDisk(file, begin, DTYPES[spec["dtype"]], size)
        arrays = _arrays(tensors)
    except (OSError, ValueError, KeyError, TypeError, SafetensorError):
        return None
    if verify and any(t.sha256() != metadata.get(SHA_PREFIX + k) for k, t in tensors.items()):
        return None
    return TokenCache(arrays, metadata)


def read_metadata(path: Path) -> dict[str, str]:
    """The metadata of the safetensors file at `path` (a cache of any format, even cut
    short); {} when it is missing or unreadable."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return _read_header(OpenFile(path))[1]
    return {}


def check_same_data(path: Path, texts: dict[str, tuple[Path, str]]) -> None:
    """Refuses text that is not what the cache at `path` (if readable, with digests) was made
    from: `texts` holds, by split name ("train", or "train.src" for one side), the file read
    and the `text_digest` of its text."""
    metadata = read_metadata(path)
    if not any(DIGEST_PREFIX + split in metadata for split in texts):
        unchecked = ", ".join(str(source) for source, _ in texts.values())
        warnings.warn(
            f"{path} is gone (or from an older qkv): {unchecked} cannot be checked against the "
            "text this run was trained on, and are taken as it",
            stacklevel=2,
        )
    for split, (source, digest) in texts.items():
        cached = metadata.get(DIGEST_PREFIX + split)
        if cached is not None and cached != digest:
            raise DataError(
                source,
                "does not hold the text this run was trained on; a resumed run takes its own "
                "data, at a new place if it moved: to train on other data, start a new run",
            )


def _read_header(file: OpenFile) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """A safetensors file's tensor entries and metadata; ValueError if it has none."""
    size = int.from_bytes(file.read(8, 0), "little")
    if not 2 <= size <= HEADER_LIMIT:
        raise ValueError(f"{file.path}: not a safetensors file")
    header = json.loads(file.read(size, 8))
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(header, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError(f"{file.path}: not a safetensors header")
    return header, metadata


def _arrays(tensors: dict[str, OnDisk]) -> dict[str, TokenArray]:
    """The token arrays of a cache's tensors; ValueError for a pair that does not fit."""
    arrays: dict[str, TokenArray] = {}
    for key, ids in tensors.items():
        if not key.endswith(".ids"):
            continue
        name = key.removesuffix(".ids")
        offsets = tensors[f"{name}.offsets"]
        if ids.dtype != IDS_DTYPE or offsets.dtype != OFFSETS_DTYPE:
            raise ValueError(f"{name}: not a token array")
        arrays[name] = TokenArray(ids, offsets)  # a ValueError without offsets
        if offsets[0:1][0] != 0 or offsets[offsets.size - 1 : offsets.size][0] != ids.size:
            raise ValueError(f"{name}: offsets do not span the ids")
    return arrays
