"""Reading inputs and writing outputs for the commands."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from qkv.data.lines import decode_utf8, gunzip, split_lines
from qkv.data.readers import read_lines
from qkv.errors import DataError
from qkv.training.checkpoint import atomic_write_text

STREAM = "-"
"""The name that means stdin (as an input) or stdout (as an output), as most tools take it."""


def file_named(path: str | None) -> str | None:
    """The file `path` names, or None where it means stdin or stdout (none given, or "-")."""
    return None if not path or path == STREAM else path


def input_lines(path: str | None) -> list[str]:
    """Lines of `path` or stdin (no path, or "-"), gunzipped if gzipped and split on "\\n"
    only; empty lines are kept (they translate to empty lines)."""
    if path := file_named(path):
        return read_lines(Path(path), allow_empty=True)
    if sys.stdin is None:  # started with stdin closed (`<&-`)
        raise DataError("<stdin>", "closed; give the input with --input FILE")
    try:
        data = sys.stdin.buffer.read()
    except OSError as error:
        raise DataError("<stdin>", f"unreadable ({error})") from None
    text = decode_utf8(gunzip(data, "<stdin>"), "<stdin>")
    return split_lines(text.removeprefix("\ufeff"), "<stdin>")


def check_output(path: str | None, source: str | None = None) -> None:
    """Fails before any work if `path` (without one, or "-", stdout) cannot be written, or is
    the input file `source`, which it would replace."""
    path, source = file_named(path), file_named(source)
    if path is None:
        if sys.stdout is None:  # started with stdout closed (`>&-`)
            raise DataError("<stdout>", "closed; give a file with --output FILE")
        return
    target = Path(path)
    if target.is_dir():
        raise DataError(path, "is a directory; give a file name")
    if source and target.exists() and Path(source).exists() and os.path.samefile(target, source):
        raise DataError(path, "is the input file, which the output would replace")
    if target.exists() and not target.is_file():  # a device or pipe, written in place
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


def write_lines(path: str | None, lines: list[str]) -> None:
    """Writes lines to `path` or stdout. A file is replaced whole or not at all (through a
    temporary sibling); a device or pipe such as /dev/stdout is written in place."""
    text = "".join(line + "\n" for line in lines)
    if path := file_named(path):
        target = Path(path)
        try:
            if target.exists() and not target.is_file():
                target.write_text(text, encoding="utf-8")
            else:
                atomic_write_text(target, text)
        except OSError as error:
            raise DataError(path, f"cannot write ({error.strerror})") from None
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


def json_line(record: object) -> str:
    """`record` as one JSON line, UTF-8 as it is but for the characters that other readers
    take for line breaks (U+2028, U+2029, U+0085), escaped so that a record stays a line."""
    text = json.dumps(record, ensure_ascii=False)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").replace("\x85", "\\u0085")
