"""Parallel text streamed into a token cache, a chunk of lines at a time: each chunk is read
and checked, digested, tokenized (in the tokenizers' Rust threads, while the next chunk is
read), filtered by length and written. Memory holds a few chunks, whatever the corpus size.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

import numpy as np
from tqdm import tqdm

from qkv.data.cache import StreamDigest, TokenCacheWriter
from qkv.data.lines import CHUNK_LINES, line_chunks
from qkv.data.readers import count_parallel
from qkv.data.tokenizer import Tokenizer
from qkv.errors import DataError

IN_FLIGHT = 2  # chunks being tokenized while the next is read


@dataclass(frozen=True)
class ParallelFiles:
    """A sentence-aligned pair of files and their number of lines."""

    src: Path
    tgt: Path
    lines: int

    @classmethod
    def counted(cls, src: Path, tgt: Path) -> ParallelFiles:
        """The pair, its lines counted (a DataError unless both sides have as many)."""
        return cls(src, tgt, count_parallel(src, tgt))

    def chunks(self, size: int = CHUNK_LINES) -> Iterator[tuple[list[str], list[str]]]:
        """Aligned chunks of (source lines, target lines), checked as `read_lines` checks."""
        sides = zip_longest(line_chunks(self.src, size), line_chunks(self.tgt, size))
        read = 0
        for src, tgt in sides:
            read += len(src or ())
            if src is None or tgt is None or len(src) != len(tgt) or read > self.lines:
                raise self.changed()
            yield src, tgt
        if read != self.lines:
            raise self.changed()

    def changed(self) -> DataError:
        return DataError(self.src, f"changed while it was read together with {self.tgt}")

    def texts(self, cap: int = 0) -> Iterator[str]:
        """Every source line, then every target line; with `cap`, every k-th line of each
        side, k chosen to give at most `cap` (evenly spread, whatever the corpus' order)."""
        stride = max(1, math.ceil(self.lines / cap)) if cap else 1
        for path in (self.src, self.tgt):
            number = 0
            for chunk in line_chunks(path):
                yield from chunk[-number % stride :: stride]
                number += len(chunk)

    def digests(self) -> tuple[str, str]:
        """The `text_digest` of each side, read a chunk at a time."""
        found = []
        for path in (self.src, self.tgt):
            digest = StreamDigest()
            digest.column(self.lines)
            try:
                for chunk in line_chunks(path):
                    digest.update(chunk)
                found.append(digest.hexdigest())
            except ValueError:  # more lines or fewer than counted
                raise self.changed() from None
        return found[0], found[1]


@dataclass(frozen=True)
class Tokenized:
    """What `tokenize_pairs` did: pairs read and kept, and each side's text digest."""

    read: int
    kept: int
    src_digest: str
    tgt_digest: str


def tokenize_pairs(
    tokenizer: Tokenizer,
    files: ParallelFiles,
    writer: TokenCacheWriter,
    names: tuple[str, str],
    limit: int,
    chunk_lines: int = CHUNK_LINES,
) -> Tokenized:
    """Tokenizes the pairs of `files` into arrays `names` of `writer`, keeping those with a
    source of 1 to limit - 1 tokens and a target of fewer than `limit` (room for BOS/EOS),
    `chunk_lines` pairs at a time."""
    digests = StreamDigest(), StreamDigest()
    for digest in digests:
        digest.column(files.lines)
    kept = 0
    with tqdm(total=files.lines, unit="pair", desc="tokenizing", disable=None, leave=False) as bar:
        for (src, tgt), (ids, lengths) in encoded(tokenizer, files.chunks(chunk_lines)):
            digests[0].update(src)
            digests[1].update(tgt)
            n = len(src)
            src_lengths, tgt_lengths = lengths[:n], lengths[n:]  # (n,) each
            keep = (src_lengths > 0) & (src_lengths < limit) & (tgt_lengths < limit)  # (n,)
            tokens = np.repeat(np.concatenate([keep, keep]), lengths)  # (N,) bool
            src_ids, tgt_ids = np.split(ids[tokens], [int(src_lengths[keep].sum())])
            writer.append(names[0], src_ids, src_lengths[keep])
            writer.append(names[1], tgt_ids, tgt_lengths[keep])
            kept += int(keep.sum())
            bar.update(n)
    return Tokenized(files.lines, kept, digests[0].hexdigest(), digests[1].hexdigest())


def encoded(
    tokenizer: Tokenizer, chunks: Iterable[tuple[list[str], list[str]]]
) -> Iterator[tuple[tuple[list[str], list[str]], tuple[np.ndarray, np.ndarray]]]:
    """Each chunk of pairs with the `Tokenizer.encode_flat` of its sources then its targets,
    in order; a worker thread tokenizes up to `IN_FLIGHT` chunks while the next is read."""
    with ThreadPoolExecutor(1, thread_name_prefix="tokenize") as pool:
        pending: deque[tuple[tuple[list[str], list[str]], Future[tuple[np.ndarray, np.ndarray]]]]
        pending = deque()
        for src, tgt in chunks:
            pending.append(((src, tgt), pool.submit(tokenizer.encode_flat, src + tgt)))
            if len(pending) > IN_FLIGHT:
                chunk, future = pending.popleft()
                yield chunk, future.result()
        for chunk, future in pending:
            yield chunk, future.result()
