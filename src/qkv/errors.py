"""User-facing errors: one line that says what is wrong and where.

The command line prints a `QkvError`'s message, without a traceback, and exits with code 2.
"""

from __future__ import annotations

from pathlib import Path


class QkvError(Exception):
    """An error caused by the user's input (files, flags, configs), not by a bug."""


class DataError(QkvError):
    """A data file is missing, unreadable or malformed; `line` (1-based) is where, if on one."""

    def __init__(self, path: str | Path, message: str, line: int | None = None) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")
        self.line = line


class ConfigError(QkvError):
    """A configuration value is out of range or inconsistent."""


class CheckpointError(QkvError):
    """A run directory or checkpoint is missing, truncated, corrupt or incompatible."""


def os_problem(error: OSError) -> str:
    """One line for an operating-system error: the path at fault and what is wrong; a path
    blocked by a file where a directory should be names that file ("runs/a/b: runs/a is a
    file, not a directory")."""
    reason = error.strerror or str(error)
    path = error.filename2 if error.filename2 is not None else error.filename
    if path is None:
        return reason
    if isinstance(error, NotADirectoryError):
        blocking = file_in_the_way(Path(path))
        if blocking is not None:
            return f"{path}: {blocking} is a file, not a directory"
    return f"{path}: {reason.lower()}"


def file_in_the_way(directory: Path) -> Path | None:
    """The first of `directory` and its parents, from the root down, that exists and is not a
    directory; None if there is none."""
    for candidate in [*reversed(directory.parents), directory]:
        if candidate.exists() and not candidate.is_dir():
            return candidate
    return None
