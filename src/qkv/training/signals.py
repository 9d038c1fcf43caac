"""Stopping a run where it stands: SIGINT, SIGTERM or a closed stdout, recorded for the trainer
to act on after its step."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any, TextIO


@contextlib.contextmanager
def stop_signals() -> Iterator[list[str]]:
    """Record SIGINT/SIGTERM, and a reader of stdout that goes away (`qkv train | head`),
    instead of dying where the run stands; the trainer checks the list after each step."""
    received: list[str] = []

    def handler(signum: int, _frame: FrameType | None) -> None:
        received.append(f"{signal.Signals(signum).name} received")

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    stdout = sys.stdout
    sys.stdout = _PipeGuard(stdout, received)
    try:
        yield received
    finally:
        sys.stdout = stdout
        for s, h in previous.items():
            signal.signal(s, h)


class _PipeGuard:
    """A text stream that takes a closed pipe as a request to stop, recorded in `received`;
    later output goes to the null device, so that neither the run nor Python's exit fails."""

    def __init__(self, stream: TextIO, received: list[str]) -> None:
        self._stream, self._received = stream, received

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._closed()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._closed()

    def _closed(self) -> None:
        if "stdout closed" in self._received:
            return
        self._received.append("stdout closed")
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
