"""The deployment commands: qkv export, qkv translate --engine/--n-best/--json, qkv evaluate
--engine, and qkv serve as a process (SIGTERM finishes the requests in flight)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

import httpx

from qkv.cli import main

pytest.importorskip("ctranslate2", reason="the deploy extra (ctranslate2) is not installed")
pytestmark = pytest.mark.usefixtures("one_thread")

DATES = ["3 March 2021", "March 4, 1999", "the 5th of May 2020", "12/01/2003", "1 Jan 2000"]


@pytest.fixture
def sentences(tmp_path: Path) -> Path:
    path = tmp_path / "in.txt"
    path.write_text("\n".join(DATES) + "\n")
    return path


def test_export_writes_a_ctranslate2_model(
    translation_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ct2"
    assert main(["export", str(translation_run), "--to", "ctranslate2", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert {"model.bin", "config.json", "qkv_export.json"} <= {p.name for p in out.iterdir()}
    note = json.loads((out / "qkv_export.json").read_text())
    assert note["quantize"] is None and len(note["weights_sha256"]) == 64


def test_export_refuses_a_classification_run(
    classification_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["export", str(classification_run), "--to", "ctranslate2", str(tmp_path / "x")]
    assert main(args) == 2
    error = capsys.readouterr().err
    assert "only translation runs export" in error and len(error.splitlines()) == 1


@pytest.mark.parametrize("beam", ["1", "4"])
def test_translate_with_either_engine_gives_the_same_lines(
    translation_run: Path,
    sentences: Path,
    tmp_path: Path,
    beam: str,
) -> None:
    outputs = []
    for engine in ("torch", "ctranslate2"):
        out = tmp_path / f"{engine}.txt"
        args = ["translate", str(translation_run), "--input", str(sentences), "--beam", beam]
        assert main([*args, "--engine", engine, "--output", str(out)]) == 0
        outputs.append(out.read_text().splitlines())
    assert outputs[0] == outputs[1] and len(outputs[0]) == len(DATES)


def test_n_best_as_json_lines(
    translation_run: Path, sentences: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["translate", str(translation_run), "--input", str(sentences), "--beam", "4"]
    assert main([*args, "--n-best", "3", "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["source"] for r in records] == DATES
    for record in records:
        scores = [h["score"] for h in record["hypotheses"]]
        assert len(scores) == 3 and scores == sorted(scores, reverse=True)
        assert all(h["tokens"] for h in record["hypotheses"])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--n-best", "3"], "--n-best needs --json"),
        (["--quantize", "int8"], "--quantize is for --engine ctranslate2"),
        (["--n-best", "6", "--json", "--beam", "4"], "n_best (6) must be between 1 and the beam"),
        (["--n-best", "0", "--json", "--beam", "4"], "n_best (0) must be between 1 and the beam"),
        (["--n-best", "-1", "--json"], "n_best (-1) must be between 1 and the beam size (5)"),
        (["--n-best", "2", "--json", "--sample"], "n_best (2) needs beam search: sampling"),
    ],
)
def test_translate_refusals(
    translation_run: Path,
    sentences: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    assert main(["translate", str(translation_run), "--input", str(sentences), *extra]) == 2
    assert message in capsys.readouterr().err


def test_evaluate_scores_the_deployed_model_alike(
    translation_run: Path, sentences: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    references = tmp_path / "ref.txt"
    references.write_text("2021-03-03\n1999-03-04\n2020-05-05\n2003-12-01\n2000-01-01\n")
    scores = []
    for engine in ("torch", "ctranslate2"):
        args = ["evaluate", str(translation_run), "--src", str(sentences), "--ref", str(references)]
        assert main([*args, "--engine", engine, "--json"]) == 0
        scores.append(json.loads(capsys.readouterr().out))
    assert scores[0]["bleu"] == scores[1]["bleu"]
    assert scores[1]["engine"] == "ctranslate2"


def test_serve_drains_requests_in_flight_on_sigterm(translation_run: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "qkv", "serve", str(translation_run), "--port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.1)
        answers: list[httpx.Response] = []
        body = {"texts": DATES * 12, "beam": 8, "n_best": 8}  # about a second of decoding
        client = threading.Thread(
            target=lambda: answers.append(httpx.post(url + "/translate", json=body, timeout=60))
        )
        client.start()
        time.sleep(0.3)  # the request is in flight
        server.send_signal(signal.SIGTERM)
        client.join(timeout=60)
        # uvicorn exits by raising the signal again once it has drained: -SIGTERM, or 0
        assert server.wait(timeout=60) in (0, -signal.SIGTERM)
        assert answers and answers[0].status_code == 200
        assert len(answers[0].json()["results"]) == len(DATES) * 12
    finally:
        server.kill()
        server.wait()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--port", "70000"], "--port must be between 1 and 65535"),
        (["--threads", "-2"], "--threads must be 0 (torch's default) or more, got -2"),
        (["--window-ms", "1e9"], "--window-ms must be between 0 and 1000"),
        (["--window-ms", "nan"], "--window-ms must be between 0 and 1000"),
        (["--batch-tokens", "0"], "--batch-tokens must be at least 1, got 0"),
        (["--max-body", "0"], "--max-body must be at least 1, got 0"),
        (["--host", "192.0.2.1"], "cannot listen on 192.0.2.1:8000"),  # not this machine
    ],
)
def test_serve_refuses_bad_options_in_one_line(
    translation_run: Path, capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    assert main(["serve", str(translation_run), *options]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_sigterm_while_the_runs_load_stops_serve_as_ctrl_c_does(
    translation_run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before uvicorn takes the signals (a first CTranslate2 conversion can take a while):
    interrupted, so that what was being written is cleaned up."""

    def terminated(*args: object) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        raise AssertionError("SIGTERM did not stop the load")

    monkeypatch.setattr("qkv.serve.models.load_served", terminated)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    assert main(["serve", str(translation_run), "--port", port]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # as it was


def test_serve_refuses_a_port_in_use_before_it_says_it_serves(
    translation_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        assert main(["serve", str(translation_run), "--port", port]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and f"cannot listen on 127.0.0.1:{port}" in captured.err


def test_a_ctranslate2_model_gathers_a_batch_while_another_decodes(translation_run: Path) -> None:
    import asyncio

    import torch

    from qkv.serve.models import ServedTranslator, load_served
    from qkv.serve.schema import TranslateRequest

    torch.set_num_threads(2)  # two replicas (the one_thread fixture restores the count)
    (served,) = load_served([translation_run], engine="ctranslate2").values()
    (lone,) = load_served([translation_run], engine="torch").values()
    assert isinstance(served, ServedTranslator) and isinstance(lone, ServedTranslator)
    assert served.translator.engine is not None and served.translator.engine.replicas == 2
    assert len(served.batcher.threads) == 2 and len(lone.batcher.threads) == 1

    async def many(requests: list[TranslateRequest]) -> list[list[dict[str, object]]]:
        return list(await asyncio.gather(*(served.answer(r) for r in requests)))

    requests = [TranslateRequest(texts=[text], beam=2) for text in DATES * 4]
    together = asyncio.run(many(requests))
    alone = [asyncio.run(many([r]))[0] for r in requests[: len(DATES)]] * 4
    # each its own answer, whatever batch it was in (scores to float32's rounding)
    assert [a[0]["n_best"][0]["ids"] for a in together] == [a[0]["n_best"][0]["ids"] for a in alone]
    scores = [a[0]["score"] for a in together]
    assert scores == pytest.approx([a[0]["score"] for a in alone], rel=1e-5)
    served.batcher.close()
    lone.batcher.close()
