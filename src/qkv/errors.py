"""User-facing errors: one line that says what is wrong and where.

The command line catches `QkvError`, prints its message and exits with code 2; nothing else in
the package prints tracebacks at users.
"""

from __future__ import annotations

from pathlib import Path


class QkvError(Exception):
    """An error caused by the user's input (files, flags, configs), not by a bug."""


class DataError(QkvError):
    """A data file is missing, unreadable or malformed.

    Args:
        path: the file at fault.
        message: what is wrong.
        line: 1-based line number, when the fault is on one line.
    """

    def __init__(self, path: str | Path, message: str, line: int | None = None) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")
        self.path = Path(path)
        self.line = line


class ConfigError(QkvError):
    """A configuration value is out of range or inconsistent."""


class CheckpointError(QkvError):
    """A run directory or checkpoint is missing, truncated, corrupt or incompatible."""
