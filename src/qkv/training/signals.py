"""Stopping a run where it stands: SIGINT, SIGTERM or a closed stdout, recorded for the trainer
to act on after its step; and SIGTERM taken as Ctrl-C by the other commands."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
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


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM raised as KeyboardInterrupt while the block runs, as Ctrl-C is: where a command
    stops, what it was writing is left unwritten. Only in the main thread, where Python
    delivers signals; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:  # None: a handler not set from Python, which cannot be set back
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


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
