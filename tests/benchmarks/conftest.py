"""The benchmark harness, imported fresh from benchmarks/ for each test that asks for it."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from tests.benchmarks.test_bench_smoke import BENCH_DIR, MODULES


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    for name in MODULES:
        sys.modules.pop(name, None)  # a fresh import under the patched path
    import bench as module

    return module
