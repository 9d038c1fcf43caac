"""The HTTP API: answers equal the Python API's, refusals name their field, requests batch."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

import httpx

from qkv.inference.classifier import Classifier
from qkv.inference.translator import Translator
from qkv.serve.app import create_app
from qkv.serve.models import Batching, Served, load_served
from qkv.serve.schema import Limits
from tests.serve.conftest import running

pytestmark = pytest.mark.usefixtures("one_thread")

DATES = ["3 March 2021", "March 4, 1999", "the 5th of May 2020", "12/01/2003"]
REVIEWS = ["a wonderful and brilliant film", "boring and awful, really dull"]
LIMITS = Limits(max_texts=8, max_chars=200, max_body=1024, max_attention_texts=2)


@pytest.fixture(scope="module")
def served(translation_run: Path, classification_run: Path) -> Iterator[dict[str, Served]]:
    models = load_served([translation_run, classification_run], batching=Batching(window=0.2))
    yield models
    for model in models.values():
        model.batcher.close()


@pytest.fixture(scope="module")
def url(served: dict[str, Served]) -> Iterator[str]:
    with running(create_app(served, LIMITS)) as address:
        yield address


def post(url: str, path: str, body: Any) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=60)


def test_health_and_models(url: str) -> None:
    assert httpx.get(url + "/health").json() == {"status": "ok"}
    models = httpx.get(url + "/models").json()["models"]
    assert [(m["name"], m["task"]) for m in models] == [
        ("dates", "translation"),
        ("reviews", "classification"),
    ]
    assert models[1]["labels"] == ["neg", "pos"]
    assert "/translate" in httpx.get(url + "/openapi.json").json()["paths"]


def test_translations_equal_the_python_api(url: str, translation_run: Path) -> None:
    translator = Translator.load(translation_run)
    answer = post(url, "/translate", {"texts": DATES, "beam": 4, "n_best": 3}).json()
    expected = translator.hypotheses(DATES, beam_size=4, n_best=3)
    assert answer["model"] == "dates"
    for result, hypotheses in zip(answer["results"], expected, strict=True):
        assert result["translation"] == hypotheses[0].text
        assert [h["text"] for h in result["n_best"]] == [h.text for h in hypotheses]
        scores = [h["score"] for h in result["n_best"]]
        assert scores == pytest.approx([h.score for h in hypotheses], rel=1e-5)
        assert scores == sorted(scores, reverse=True)
        assert result["n_best"][0]["tokens"] == hypotheses[0].tokens


def test_greedy_and_sampled_translations_carry_log_probabilities(url: str) -> None:
    for options in ({"beam": 1}, {"sampling": True, "top_k": 5, "seed": 3}):
        result = post(url, "/translate", {"texts": DATES[:1], **options}).json()["results"][0]
        assert len(result["n_best"]) == 1
        assert result["score"] < 0


def test_classification_equals_the_python_api(url: str, classification_run: Path) -> None:
    probabilities = Classifier.load(classification_run).probabilities(REVIEWS)
    answer = post(url, "/classify", {"texts": REVIEWS}).json()
    assert answer["model"] == "reviews"
    for result, expected in zip(answer["results"], probabilities.tolist(), strict=True):
        assert list(result["probabilities"].values()) == pytest.approx(expected, abs=1e-6)
        assert result["label"] == max(result["probabilities"], key=result["probabilities"].get)


def test_translation_attention_has_the_shapes_of_its_tokens(url: str) -> None:
    body = {"texts": DATES[:1], "beam": 1, "attention": True}
    attention = post(url, "/translate", body).json()["results"][0]["attention"]
    source, target = len(attention["source_tokens"]), len(attention["target_tokens"])
    assert len(attention["encoder"]) == 2  # layers of the tiny preset
    for layer in attention["cross"]:
        for head in layer:
            assert len(head) == target and all(len(row) == source for row in head)
            assert all(sum(row) == pytest.approx(1.0, abs=1e-3) for row in head)
    for layer in attention["decoder"]:
        for head in layer:  # causal: nothing above the diagonal
            assert all(head[q][k] == 0 for q in range(target) for k in range(q + 1, target))


@pytest.mark.parametrize("path", ["/translate", "/classify"])
def test_attention_is_worked_out_while_the_server_serves_on(
    translation_run: Path, classification_run: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    from qkv.serve import models

    entered, release = threading.Event(), threading.Event()
    name = "translation_attention" if path == "/translate" else "classification_attention"
    original = getattr(models, name)

    def held(*args: Any) -> Any:  # a long text's attention, say
        entered.set()
        release.wait(30)
        return original(*args)

    monkeypatch.setattr(models, name, held)
    served = load_served([translation_run, classification_run])  # its app closes it
    texts = DATES[:1] if path == "/translate" else REVIEWS[:1]
    with running(create_app(served, LIMITS)) as address, ThreadPoolExecutor(1) as pool:
        pending = pool.submit(post, address, path, {"texts": texts, "attention": True})
        assert entered.wait(30)
        try:  # on the event loop, the forward pass would hold this answer until it is done
            assert httpx.get(address + "/health", timeout=5).json() == {"status": "ok"}
        finally:
            release.set()
        assert "attention" in pending.result().json()["results"][0]


def test_classification_attention_weighs_each_token(url: str) -> None:
    body = {"texts": REVIEWS[:1], "attention": True}
    result = post(url, "/classify", body).json()["results"][0]
    attention = result["attention"]
    assert len(attention["token_weights"]) == len(attention["tokens"])
    assert attention["label"] == result["label"]
    assert len(attention["encoder"][0][0]) == len(attention["tokens"])


BAD = [
    ("/translate", b'{"texts": ["a"', "body", 422),
    ("/translate", b"\xff\xfe\x00binary junk", "body", 422),
    ("/translate", {"texts": "3 March 2021"}, "texts", 422),
    ("/translate", {"texts": []}, "texts", 422),
    ("/translate", {"texts": ["ok", "   "]}, "texts[1]", 422),
    ("/translate", {"texts": ["x" * 201]}, "texts[0]", 413),
    ("/translate", {"texts": ["a"] * 9}, "texts", 413),
    ("/translate", {"texts": ["a"], "beam": 0}, "beam", 422),
    ("/translate", {"texts": ["a"], "beam": "5"}, "beam", 422),
    ("/translate", {"texts": ["a"], "beam": 2, "n_best": 3}, "n_best", 422),
    ("/translate", {"texts": ["a"], "colour": "red"}, "colour", 422),
    ("/translate", {"texts": ["a"], "model": "nope"}, "model", 404),
    ("/translate", {"texts": ["a"], "model": "reviews"}, "model", 422),
    ("/translate", {"texts": ["a", "b", "c"], "attention": True}, "attention", 413),
    ("/classify", {"texts": ["a" * 150] * 8, "model": "reviews"}, "body", 413),
    ("/classify", {"texts": [1, 2]}, "texts[0]", 422),  # as qkv's own checks name it
    ("/translate", b'{"texts": ["\xe4"]}', "body", 400),  # Latin-1, not UTF-8
]


@pytest.mark.parametrize(("path", "body", "field", "status"), BAD, ids=[b[2] for b in BAD])
def test_bad_requests_are_refused_with_the_field(
    url: str, path: str, body: Any, field: str, status: int
) -> None:
    if isinstance(body, bytes):
        headers = {"content-type": "application/json"}
        response = httpx.post(url + path, content=body, headers=headers)
    else:
        response = post(url, path, body)
    assert response.status_code == status, response.text
    error = response.json()
    assert error["field"] == field
    assert error["error"]
    assert httpx.get(url + "/health").status_code == 200


def test_a_streamed_body_is_refused_once_it_passes_the_limit(url: str) -> None:
    sent = []

    def chunks() -> Iterator[bytes]:  # no Content-Length: sent chunked
        yield b'{"texts": ["'
        for _ in range(100):
            sent.append(1)
            yield b"a" * 100
        yield b'"]}'

    response = httpx.post(url + "/translate", content=chunks(), timeout=60)
    assert response.status_code == 413, response.text
    assert response.json() == {"error": "request body over 1024 bytes", "field": "body"}


def test_a_streamed_body_is_not_read_past_the_limit() -> None:
    """At the ASGI level: the 413 goes out once 1,024 bytes are past, the rest left unread."""
    chunk = {"type": "http.request", "body": b"a" * 100, "more_body": True}
    messages = [chunk] * 100 + [{"type": "http.request", "body": b"", "more_body": False}]
    read, sent = 0, []

    async def receive() -> dict[str, Any]:
        nonlocal read
        read += 1
        return messages[read - 1]

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/translate", "raw_path": b"/translate", "query_string": b"",
        "root_path": "", "headers": [(b"content-type", b"application/json")],
        "server": ("test", 80), "client": ("test", 1),
    }  # fmt: skip
    asyncio.run(create_app({}, LIMITS)(scope, receive, send))
    assert sent[0]["status"] == 413
    assert json.loads(sent[1]["body"]) == {"error": "request body over 1024 bytes", "field": "body"}
    assert read == 11  # 1,100 bytes read of 10,000


def test_other_refusals_keep_the_error_format(url: str) -> None:
    for response, field, text in (
        (httpx.get(url + "/nowhere"), "path", "no endpoint /nowhere; see /docs"),
        (httpx.get(url + "/translate"), "method", "/translate does not take GET"),
        (
            httpx.post(url + "/translate", content=b'{"texts": ["a"]}'),  # curl -d's form type
            "body",
            "send a JSON object, with Content-Type: application/json",
        ),
    ):
        assert response.json() == {"error": text, "field": field}


def test_the_page_and_its_assets_are_served(url: str) -> None:
    page = httpx.get(url + "/")
    assert page.status_code == 200
    assert "<html" in page.text


def test_concurrent_requests_decode_together_and_each_gets_its_own(
    url: str, served: dict[str, Served]
) -> None:
    alone = [post(url, "/translate", {"texts": [d], "beam": 3}).json() for d in DATES]
    batches_before = served["dates"].batcher.batches
    with ThreadPoolExecutor(len(DATES) * 2) as pool:
        bodies = [{"texts": [d], "beam": 3} for d in DATES * 2]
        answers = list(pool.map(lambda b: post(url, "/translate", b).json(), bodies))
    assert served["dates"].batcher.batches - batches_before < len(bodies)
    assert [texts(a) for a in answers] == [texts(a) for a in alone * 2]
    expected = [score for a in alone * 2 for score in scores(a)]
    assert [score for a in answers for score in scores(a)] == pytest.approx(expected, rel=1e-5)


def test_a_sampled_request_gets_what_it_gets_alone(url: str) -> None:
    body = {"sampling": True, "temperature": 2.0, "seed": 5}
    alone = [post(url, "/translate", {"texts": [d], **body}).json() for d in DATES]
    with ThreadPoolExecutor(len(DATES) * 2) as pool:
        bodies = [{"texts": [d], **body} for d in DATES * 2]
        answers = list(pool.map(lambda b: post(url, "/translate", b).json(), bodies))
    assert [texts(a) for a in answers] == [texts(a) for a in alone * 2]


def texts(answer: dict[str, Any]) -> list[list[str]]:
    """The translations (and their tokens) of an answer, by text, best first."""
    return [[json.dumps([h["text"], h["tokens"]]) for h in r["n_best"]] for r in answer["results"]]


def scores(answer: dict[str, Any]) -> list[float]:
    return [h["score"] for r in answer["results"] for h in r["n_best"]]


def test_options_of_the_other_search_are_ignored_and_keep_no_request_apart() -> None:
    """The page sends every option; those that do not apply are set to their defaults, so
    requests that differ only there share a batch."""
    from qkv.serve.models import TranslateOptions
    from qkv.serve.schema import TranslateRequest

    searched = [
        TranslateOptions.of(TranslateRequest(texts=["x"], beam=3, top_k=k, seed=k)) for k in (0, 9)
    ]
    assert searched[0] == searched[1] and searched[0].beam == 3
    sampled = TranslateOptions.of(TranslateRequest(texts=["x"], sampling=True, beam=3, alpha=2.0))
    assert (sampled.beam, sampled.alpha) == (5, 0.6)
