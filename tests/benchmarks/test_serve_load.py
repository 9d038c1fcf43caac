"""The serve load benchmark's wrk client: its Lua script, and a run against a stand-in server."""

from __future__ import annotations

import json
import shutil
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import ModuleType
from typing import ClassVar

import pytest

from tests.benchmarks.test_bench_smoke import BENCH_DIR


@pytest.fixture
def serve_load(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    sys.modules.pop("serve_load", None)
    import serve_load as module

    return module


class StandIn(BaseHTTPRequestHandler):
    """Answers /translate as `qkv serve` does, but with no hypothesis for a text holding "bad"."""

    texts: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = body["texts"][0]
        self.texts.append(text)
        found = [] if "bad" in text else [{"text": text.upper(), "score": -1.0}]
        answer = json.dumps({"results": [{"n_best": found}]}).replace(" ", "").encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


class Quiet(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # wrk closes its connections when its time is up, mid-answer perhaps


@pytest.fixture
def stand_in() -> Iterator[str]:
    StandIn.texts = []
    server = Quiet(("127.0.0.1", 0), StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_script_quotes_every_body_whole(serve_load: ModuleType) -> None:
    texts = ["Ein Hund.", 'Er sagt "]=]" und geht.']
    script = serve_load.wrk_script(texts, {"beam": 5})
    assert "[==[" in script  # the second text closes a level-1 bracket: level 2 it is
    for text in texts:
        assert json.dumps({"beam": 5, "texts": [text]}) in script


@pytest.mark.skipif(shutil.which("wrk") is None, reason="needs wrk (apt-get install wrk)")
def test_wrk_sends_the_texts_in_turn_and_counts_empty_answers(
    serve_load: ModuleType, stand_in: str
) -> None:
    texts = ["ein Hund", "eine Katze", "ein bad Vogel"]
    row = serve_load.wrk_load(stand_in, texts, 2, {"beam": 1}, 1)
    assert row["requests"] > 3 and row["clients"] == 2
    assert set(StandIn.texts) == set(texts)
    # wrk counts the answers that came within its time: up to one a client more reached the server
    assert row["requests"] <= len(StandIn.texts) <= row["requests"] + 2
    bad = sum("bad" in text for text in StandIn.texts)
    assert 0 < bad - 2 <= row["errors"] <= bad
    assert row["requests_per_s"] == pytest.approx(row["requests"] / row["seconds"])
    assert row["p50_ms"] <= row["p99_ms"]
