"""Two tiny trained runs, a translation and a classification one, for the server's tests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from qkv.cli import main
from tests.tasks.helpers import write_dates
from tests.tasks.test_classification_e2e import make_rows, write_jsonl


@pytest.fixture(scope="session")
def translation_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("serve-translation")
    data = write_dates(root / "data", train=400, val=30)
    out = root / "dates"
    args = ["train", "translation", "--data", str(data), "--src", "src", "--tgt", "tgt"]
    settings = ["--preset", "tiny", "vocab_size=120", "max_steps=80", "eval_every=80"]
    assert main([*args, "--out", str(out), *settings, "threads=1"]) == 0
    return out


@pytest.fixture(scope="session")
def classification_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("serve-classification")
    train = write_jsonl(root / "train.jsonl", make_rows(400, ["pos", "neg"], seed=1))
    out = root / "reviews"
    settings = ["--preset", "tiny", "max_steps=60", "eval_every=60", "vocab_size=200"]
    assert (
        main(["train", "classification", "--train", str(train), "--out", str(out), *settings]) == 0
    )
    return out


@contextmanager
def running(app: Any) -> Iterator[str]:
    """`app` served by uvicorn on a free port of 127.0.0.1, in a thread; yields its URL."""
    import uvicorn

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
