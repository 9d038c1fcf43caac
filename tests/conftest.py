"""Shared test settings: deterministic, two threads at most."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

torch.set_num_threads(min(2, os.cpu_count() or 1))

# A shell starts background jobs with Ctrl-C ignored; the Ctrl-C tests need Python's own handler.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

DATA_DIR = Path(
    os.environ.get("QKV_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data")
)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread, above all on a busy machine.

    For a module of tiny-model tests: `pytestmark = pytest.mark.usefixtures("one_thread")`.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def data_dir() -> Path:
    """The real data sets; tests using them skip when they are absent."""
    if not (DATA_DIR / "multi30k").is_dir() or not (DATA_DIR / "imdb").is_dir():
        pytest.skip(f"real data sets not found under {DATA_DIR} (set QKV_DATA)")
    return DATA_DIR
