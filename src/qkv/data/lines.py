"""Lines of UTF-8 text files, plain or gzipped, read a chunk at a time: a corpus larger than
memory is checked, line by line, as it streams. Every problem is a `DataError` naming the file
and, where it applies, the 1-based line.
"""

from __future__ import annotations

import gzip
import io
import unicodedata
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from itertools import islice
from pathlib import Path
from typing import BinaryIO, TypeVar

from qkv.errors import DataError

GZIP_MAGIC = b"\x1f\x8b"
NO_FILE, A_DIRECTORY = "no such file", "is a directory, expected a file"
CHUNK_LINES = 4096  # lines read, checked (and tokenized) at a time
BLOCK_BYTES = 1 << 20  # bytes read at a time when only counting lines
CR_ALONE = "lines end in a carriage return alone (classic Mac OS); convert them to \\n"
_T = TypeVar("_T")


def is_blank(text: str) -> bool:
    """Whether `text` is only whitespace and invisible format characters (zero-width spaces
    and joiners, direction marks, byte-order marks)."""
    return all(c.isspace() or unicodedata.category(c) == "Cf" for c in text)


def decode_utf8(data: bytes, path: str | Path, first_line: int = 1) -> str:
    """`data` (lines from `first_line` on) decoded as UTF-8, else a DataError naming the line,
    column and byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = first_line + data.count(b"\n", 0, error.start)
        line_start = data.rfind(b"\n", 0, error.start) + 1
        column = len(data[line_start : error.start].decode("utf-8")) + 1  # valid up to the error
        byte = data[error.start]
        raise DataError(
            path, f"invalid UTF-8 (byte 0x{byte:02x} at column {column})", line=line
        ) from None


def line_chunks(
    path: str | Path,
    size: int = CHUNK_LINES,
    *,
    allow_empty: bool = False,
    stream: io.BufferedReader | None = None,
) -> Iterator[list[str]]:
    """The lines of a UTF-8 text file, optionally gzipped, `size` at a time (the last chunk
    fewer), split on "\\n" only (a stray U+2028 cannot shift a parallel corpus out of
    alignment), without the carriage returns that end them or a leading byte-order mark. A
    blank line (see `is_blank`) is a DataError unless `allow_empty`. Only one chunk is held.
    `stream`: the bytes to read (stdin's, say) instead of the file, which `path` then names;
    an empty file is a DataError, an empty stream has no lines (the end of a pipe)."""
    first = 1  # the number of the chunk's first line
    with _opened(path, stream) as handle:
        while raw := _read(path, lambda: list(islice(handle, size))):
            text = decode_utf8(b"".join(raw), path, first)
            if first == 1:
                text = text.removeprefix("\ufeff")
                if not text:
                    break
            lines = split_lines(text, path) if first == 1 else split_text(text)
            if not allow_empty and (blank := _first_blank(lines)) is not None:
                raise DataError(path, "empty line", line=first + blank)
            first += len(lines)
            yield lines
    if first == 1 and stream is None:
        raise DataError(path, "file is empty")


def split_text(text: str) -> list[str]:
    """The lines of `text`, split on "\\n" only, without the carriage returns that end them
    (a final "\\n" ends the last line; it does not start another)."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.rstrip("\r") for line in lines]


def split_lines(text: str, path: str | Path) -> list[str]:
    """Lines of `text` (read from `path`) as `split_text` splits them (on "\\n" only); a
    DataError if carriage returns alone end them."""
    lines = split_text(text)
    if "\n" not in text and len(lines) == 1 and "\r" in lines[0]:  # "\n"-ended: a CR inside
        raise DataError(path, CR_ALONE)
    return lines


def read_text(path: str | Path) -> str:
    """A whole UTF-8 file, plain or gzipped, without a leading byte-order mark."""
    with _opened(path) as handle:
        text = decode_utf8(_read(path, handle.read), path).removeprefix("\ufeff")
    if not text:
        raise DataError(path, "file is empty")
    return text


def count_lines(path: str | Path) -> int:
    """How many lines `line_chunks` finds in a file, counted on its bytes (fast, no check)."""
    count, last = 0, b"\n"
    with _opened(path) as handle:
        while block := _read(path, lambda: handle.read(BLOCK_BYTES)):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def _first_blank(lines: list[str]) -> int | None:
    """The index of the first blank line, else None (a line opening with a letter or digit
    is not blank: the common case costs no character-by-character look)."""
    for index, line in enumerate(lines):
        if not line[:1].isalnum() and is_blank(line):
            return index
    return None


@contextmanager
def _opened(path: str | Path, stream: io.BufferedReader | None = None) -> Iterator[BinaryIO]:
    """The file's bytes, or `stream`'s (left open), gunzipped if they are gzipped (by their
    magic bytes)."""
    with nullcontext(stream) if stream else _read(path, lambda: open(path, "rb")) as handle:
        head = _read(path, lambda: handle.peek(2)[:2])
        if Path(path).suffix == ".gz" and head and head != GZIP_MAGIC:
            raise DataError(path, "name ends in .gz but the file is not gzip-compressed")
        if head != GZIP_MAGIC:
            yield handle
            return
        with gzip.GzipFile(fileobj=handle) as unpacked:
            yield unpacked  # type: ignore[misc]


def _read(path: str | Path, read: Callable[[], _T]) -> _T:
    """`read()` (opening, reading or gunzipping), its errors as DataErrors (a truncated gzip
    stream shows only as it is read)."""
    try:
        return read()
    except FileNotFoundError:
        raise DataError(path, NO_FILE) from None
    except IsADirectoryError:
        raise DataError(path, A_DIRECTORY) from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as error:
        raise DataError(path, f"corrupt or truncated gzip file ({error})") from None
    except OSError as error:
        raise DataError(path, f"cannot read file ({error.strerror or error})") from None
