"""The fast paths' tests take oneDNN's products on every CPU, also where training prefers MKL's
(`qkv.fast.linear.preferred`), so that their equality to the reference is tested everywhere."""

from __future__ import annotations

import pytest

from qkv.fast import linear


@pytest.fixture(autouse=True)
def _onednn_products(monkeypatch: pytest.MonkeyPatch) -> None:
    if linear.onednn_available():
        monkeypatch.setattr(linear, "preferred", lambda: True)
