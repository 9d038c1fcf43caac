"""Load on `qkv serve`: concurrent clients sending Multi30k sentences to /translate.

    python benchmarks/serve_load.py RUN [--engine torch|ctranslate2] [--quantize int8] \\
        [--clients 1,8,32] [--requests 256] [--data ../shared/data/multi30k]

Starts `qkv serve RUN` on 127.0.0.1 in a process of its own, then for each client count sends
`--requests` requests (one sentence each, beam 5 by default), each client waiting for its answer
before sending the next. Reports requests/s, sentences/s, p50/p99 latency, errors, and the
server's peak RSS, as a Markdown table (and JSON with --json).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]


def sentences(data: Path, count: int) -> list[str]:
    path = data / "test_2016_flickr.de.gz"
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        lines = [line.strip() for line in handle if line.strip()]
    return [lines[i % len(lines)] for i in range(count)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_server(args: argparse.Namespace, port: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "qkv", "serve", str(args.run), "--port", str(port)]
    command += ["--engine", args.engine, "--threads", str(args.threads)]
    if args.quantize:
        command += ["--quantize", args.quantize]
    server = subprocess.Popen(command, cwd=ROOT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with {server.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit("the server did not start within 300 s")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def load(url: str, texts: list[str], clients: int, body: dict[str, Any]) -> dict[str, Any]:
    """`clients` clients taking the texts in turn, one request a text."""
    latencies: list[float] = []
    errors = 0
    queue = list(reversed(texts))

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal errors
        while queue:
            text = queue.pop()
            start = time.perf_counter()
            try:
                response = await http.post(url + "/translate", json={**body, "texts": [text]})
                ok = response.status_code == 200 and response.json()["results"][0]["n_best"]
            except (httpx.HTTPError, ValueError, KeyError):
                ok = False
            latencies.append(time.perf_counter() - start)
            errors += not ok

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        seconds = time.perf_counter() - start
    latencies.sort()
    return {
        "clients": clients,
        "requests": len(texts),
        "seconds": seconds,
        "requests_per_s": len(texts) / seconds,
        "sentences_per_s": len(texts) / seconds,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "errors": errors,
    }


def table(rows: list[dict[str, Any]], title: str) -> str:
    lines = [
        f"{title}",
        "",
        "| clients | requests | req/s | sent/s | p50 ms | p99 ms | errors | peak RSS MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['clients']} | {r['requests']} | {r['requests_per_s']:.1f} | "
            f"{r['sentences_per_s']:.1f} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} | "
            f"{r['errors']} | {r['peak_rss_mb']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="a translation run directory")
    parser.add_argument("--engine", default="torch", choices=["torch", "ctranslate2"])
    parser.add_argument("--quantize", default=None)
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--requests", type=int, default=256, help="requests per client count")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "multi30k")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    port = free_port()
    server = start_server(args, port)
    url = f"http://127.0.0.1:{port}"
    rows = []
    try:
        texts = sentences(args.data, args.requests)
        asyncio.run(load(url, texts[:8], 2, {"beam": args.beam}))  # warm-up
        for clients in [int(c) for c in args.clients.split(",")]:
            row = asyncio.run(load(url, texts, clients, {"beam": args.beam}))
            row["peak_rss_mb"] = peak_rss_mb(server.pid)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)
    engine = args.engine + (f" {args.quantize}" if args.quantize else "")
    print(table(rows, f"`qkv serve`, {engine} engine, beam {args.beam}, {args.threads} threads"))
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args), "rows": rows}, default=str, indent=2))


if __name__ == "__main__":
    main()
