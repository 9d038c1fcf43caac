"""Token id sequences stored flat: `ids` (N,) int32 and `offsets` (n + 1,) int64, sequence i
being `ids[offsets[i]:offsets[i + 1]]`. In memory (small sets, tests) or on disk in a token
cache (`qkv.data.cache`), where rows are read as they are asked for.

On disk, rows are read with positioned reads, not through a memory map: every page a map
touches counts in the process's resident memory, and with the page cache's large folios one
touch maps up to 2 MiB, so random rows of a large cache would soon map all of it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

IDS_DTYPE, OFFSETS_DTYPE = np.dtype("<i4"), np.dtype("<i8")
READ_BLOCK = 1 << 20  # entries read at a time by a pass over a whole array


class OpenFile:
    """A read-only file descriptor, closed with its last user."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.fd = os.open(self.path, os.O_RDONLY)

    def __del__(self) -> None:
        if hasattr(self, "fd"):
            os.close(self.fd)

    def read(self, count: int, at: int) -> bytes:
        """`count` bytes at byte `at`; OSError if the file is shorter than that now."""
        data = os.pread(self.fd, count, at)
        while len(data) < count and (more := os.pread(self.fd, count - len(data), at + len(data))):
            data += more
        if len(data) < count:
            raise OSError(f"{self.path}: file shorter than its header says (truncated?)")
        return data


class OnDisk:
    """A flat array of `size` entries of `dtype` at byte `start` of a file, sliced as a numpy
    array is (`array[start:stop]`, no step) but read from the file at each slice."""

    def __init__(self, file: OpenFile, start: int, dtype: np.dtype, size: int) -> None:
        self.file, self.start, self.dtype, self.size = file, start, dtype, size

    def __getitem__(self, span: slice) -> np.ndarray:
        item = self.dtype.itemsize
        data = self.file.read((span.stop - span.start) * item, self.start + span.start * item)
        return np.frombuffer(data, dtype=self.dtype)

    def sha256(self) -> str:
        """The SHA-256 of its bytes, read a block at a time."""
        sha = hashlib.sha256()
        for begin in range(0, self.size, READ_BLOCK):
            sha.update(self[begin : min(begin + READ_BLOCK, self.size)].data)
        return sha.hexdigest()


class TokenArray:
    """n sequences of token ids: `len`, `lengths`, and rows as int32 arrays."""

    def __init__(self, ids: np.ndarray | OnDisk, offsets: np.ndarray | OnDisk) -> None:
        if offsets.size < 1:
            raise ValueError("offsets need at least one entry (0)")
        self.ids, self.offsets = ids, offsets

    @classmethod
    def from_lists(cls, sequences: Iterable[Sequence[int]]) -> TokenArray:
        """An in-memory array of these sequences."""
        rows = [np.asarray(row, dtype=IDS_DTYPE) for row in sequences]
        lengths = np.fromiter(map(len, rows), dtype=OFFSETS_DTYPE, count=len(rows))
        offsets = np.concatenate([np.zeros(1, OFFSETS_DTYPE), np.cumsum(lengths)])  # (n + 1,)
        ids = np.concatenate(rows) if rows else np.zeros(0, IDS_DTYPE)  # (N,)
        return cls(ids, offsets)

    @property
    def on_disk(self) -> bool:
        """Whether rows are read from a file as they are asked for."""
        return isinstance(self.ids, OnDisk)

    def __len__(self) -> int:
        return self.offsets.size - 1

    def __getitem__(self, index: int) -> np.ndarray:
        """Row `index`: (L,) int32."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"row {index} of {len(self)}")
        index %= len(self)
        start, stop = (int(x) for x in self.offsets[index : index + 2])
        return self.ids[start:stop]

    def _blocks(self) -> Iterator[tuple[int, np.ndarray]]:
        """The offsets a block of rows at a time: the first row's index and (rows + 1,)."""
        for block in range(0, len(self), READ_BLOCK):
            yield block, self.offsets[block : min(block + READ_BLOCK, len(self)) + 1]

    def __iter__(self) -> Iterator[np.ndarray]:
        for _, bounds in self._blocks():
            run = self.ids[int(bounds[0]) : int(bounds[-1])]
            yield from np.split(run, (bounds[1:-1] - bounds[0]).tolist())

    def rows(self, indices: Iterable[int]) -> list[np.ndarray]:
        """The rows at `indices`, in their order."""
        return [self[int(i)] for i in indices]

    @property
    def lengths(self) -> np.ndarray:
        """(n,) int32: each row's length, read in one pass."""
        out = np.empty(len(self), dtype=np.int32)
        for block, bounds in self._blocks():
            out[block : block + len(bounds) - 1] = np.diff(bounds)
        return out

    def flat(self) -> np.ndarray:
        """(N,) int32: every id, row after row (a label array's labels, say)."""
        return self.ids[0 : self.ids.size]

    def tolist(self) -> list[list[int]]:
        """Every row as a list of ints (for small sets)."""
        return [row.tolist() for row in self]


def token_array(rows: TokenArray | Iterable[Sequence[int]]) -> TokenArray:
    """`rows` as a TokenArray (lists of ids are copied into one)."""
    return rows if isinstance(rows, TokenArray) else TokenArray.from_lists(rows)


def id_lists(rows: TokenArray | Iterable[Sequence[int]]) -> list[list[int]]:
    """`rows` as lists of ids (for small sets)."""
    return rows.tolist() if isinstance(rows, TokenArray) else [list(row) for row in rows]
