"""Reading inputs and writing outputs for the commands."""

from __future__ import annotations

import glob
import io
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from pathlib import Path
from typing import TextIO

from qkv.data.lines import CHUNK_LINES, line_chunks
from qkv.errors import DataError
from qkv.training.checkpoint import UMASK, fsync_dir, in_place

STREAM = "-"
"""The name that means stdin (as an input) or stdout (as an output), as most tools take it."""


def file_named(path: str | None) -> str | None:
    """The file `path` names, or None where it means stdin or stdout (none given, or "-")."""
    return None if not path or path == STREAM else path


def input_chunks(path: str | None, size: int = CHUNK_LINES) -> Iterator[list[str]]:
    """Lines of `path` or stdin (no path, or "-"), gunzipped if gzipped and split on "\\n"
    only, a chunk at a time (see `line_chunks`), so that an input of any length is read in
    the same memory; empty lines are kept (they translate to empty lines). Empty stdin has
    no lines; an empty file is a DataError."""
    if path := file_named(path):
        yield from line_chunks(Path(path), size, allow_empty=True)
        return
    if sys.stdin is None:  # started with stdin closed (`<&-`)
        raise DataError("<stdin>", "closed; give the input with --input FILE")
    stream = sys.stdin.buffer
    if not isinstance(stream, io.BufferedReader):  # a stdin replaced by a test, say
        stream = io.BufferedReader(stream)
    yield from line_chunks("<stdin>", size, allow_empty=True, stream=stream)


def check_output(path: str | None, source: str | None = None) -> None:
    """Fails before any work if `path` (without one, or "-", stdout) cannot be written, or is
    the input file `source`, which it would replace."""
    path, source = file_named(path), file_named(source)
    if path is None:
        if sys.stdout is None:  # started with stdout closed (`>&-`)
            raise DataError("<stdout>", "closed; give a file with --output FILE")
        if source and Path(source).exists() and _stdout_is(Path(source)):  # `>> in.txt`
            raise DataError("<stdout>", "is the input file, which would grow as it is read")
        return
    target = Path(path)
    if target.is_dir():
        raise DataError(path, "is a directory; give a file name")
    if source and target.exists() and Path(source).exists() and os.path.samefile(target, source):
        raise DataError(path, "is the input file, which the output would replace")
    if in_place(target):
        if not os.access(target, os.W_OK):
            raise DataError(path, "cannot write (permission denied)")
        return
    if not target.parent.is_dir():
        raise DataError(path, f"cannot write (no directory {target.parent})")
    # Create and remove a sibling, as the write will: os.access says yes to root even where
    # the file system says no (/proc, read-only mounts).
    probe = target.with_name(f".{target.name}.{os.getpid()}.probe")
    try:
        probe.open("x").close()
        probe.unlink()
    except OSError as error:
        raise DataError(path, f"cannot write ({error.strerror or error})") from None


def _stdout_is(path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(sys.stdout.fileno()), path.stat())
    except (OSError, ValueError, io.UnsupportedOperation):  # no descriptor (a test's stdout)
        return False


@contextmanager
def output_lines(path: str | None) -> Iterator[Callable[[list[str]], None]]:
    """A function that writes lines to `path` or stdout (none given, or "-") as they come.
    A file is replaced whole when the block ends, or not at all if it fails: it is written as
    a temporary sibling of its own meanwhile, readable by its owner only, then given the
    file's permissions (a new one's as `open` makes them); a symbolic link is written
    through. Where `in_place`, the lines are appended as they come, as to stdout (a shell's
    `>>` appends, its `>` has emptied the file). A write that fails is a DataError naming
    `path`."""
    name = file_named(path)
    if name is None:
        yield lambda lines: _write(sys.stdout, lines, "<stdout>")
        return
    if in_place(given := Path(name)):
        with _cannot_write(name):
            handle = given.open("a", encoding="utf-8")
        try:
            yield lambda lines: _write(handle, lines, name)
        finally:
            with suppress(OSError):  # flushing again what could not be written
                handle.close()
        return
    target = given.resolve()
    mode = target.stat().st_mode & 0o7777 if target.is_file() else 0o666 & ~UMASK
    for left in target.parent.glob(f".{glob.escape(target.name)}.*.tmp"):  # by a killed run
        with suppress(OSError):
            left.unlink()
    with _cannot_write(name):
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    handle = os.fdopen(fd, "w", encoding="utf-8")
    try:
        yield lambda lines: _write(handle, lines, name)
        with _cannot_write(name), handle:
            handle.flush()
            os.fsync(handle.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, target)
            fsync_dir(target.parent)
    finally:
        with suppress(OSError):  # closed already, unless the block failed
            handle.close()
        with suppress(FileNotFoundError):  # renamed already, unless something failed
            os.unlink(tmp)


@contextmanager
def _cannot_write(name: str) -> Iterator[None]:
    try:
        yield
    except OSError as error:
        raise DataError(name, f"cannot write ({error.strerror or error})") from None


def _write(handle: TextIO, lines: list[str], name: str) -> None:
    # stdout's errors (a closed pipe, say) are left to the command line's own handling.
    with nullcontext() if name == "<stdout>" else _cannot_write(name):
        handle.write("".join(line + "\n" for line in lines))
        handle.flush()


def json_line(record: object) -> str:
    """`record` as one JSON line, UTF-8 as it is but for the characters that other readers
    take for line breaks (U+2028, U+2029, U+0085), escaped so that a record stays a line."""
    text = json.dumps(record, ensure_ascii=False)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").replace("\x85", "\\u0085")
