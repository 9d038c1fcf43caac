"""Load on `qkv serve`: concurrent clients sending Multi30k sentences to /translate.

    python benchmarks/serve_load.py RUN [--engine torch|ctranslate2] [--quantize int8] \\
        [--clients 1,8,32] [--requests 256] [--data ../shared/data/multi30k] [--engine-alone] \\
        [--client httpx|wrk] [--seconds 15]

Starts `qkv serve RUN` on 127.0.0.1 in a process of its own, then for each client count sends
`--requests` requests (one sentence each, beam 5 by default), each client waiting for its answer
before sending the next. Reports requests/s, sentences/s, p50/p99 latency, errors, the CPU
time a request took in the server and in the clients (they share the machine), and the
server's peak RSS, as a Markdown table (and JSON with --json). With --engine-alone it first
times the engine itself in this process, on batches as wide as each client count: the most
that batching can give that many clients.

The clients are asyncio tasks on one `httpx.AsyncClient` by default. `--client wrk` sends the
same requests from wrk (Debian's `wrk`), one thread holding a connection a client, for
`--seconds` a client count instead of a number of requests: a client in C takes a tenth of the
CPU that httpx takes a request, CPU that the server, on the same cores, would otherwise lose.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
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


def cpu_seconds(pid: int) -> float:
    """The user and system CPU time of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


WRK_SCRIPT = """
local bodies = {BODIES}
sent, bad = 0, 0  -- globals: done() reads each thread's `bad`
local threads = {}
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
setup = function(thread) table.insert(threads, thread) end
request = function()
  sent = sent + 1
  return wrk.format(nil, nil, nil, bodies[(sent - 1) % #bodies + 1])
end
response = function(status, headers, body)
  if status ~= 200 or not body:find('"n_best":[{', 1, true) then bad = bad + 1 end
end
done = function(summary, latency, requests)
  local errors = summary.errors
  local failed = errors.connect + errors.read + errors.write + errors.timeout
  for _, thread in ipairs(threads) do failed = failed + thread:get("bad") end
  io.write(string.format(
    '{"requests": %d, "seconds": %.4f, "p50_ms": %.2f, "p99_ms": %.2f, "errors": %d}\\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50) / 1e3,
    latency:percentile(99) / 1e3, failed))
end
"""


def wrk_script(texts: list[str], body: dict[str, Any]) -> str:
    """wrk's Lua script: POST one text a request, in turn; count a failed or empty answer."""
    bodies = [json.dumps({**body, "texts": [text]}) for text in texts]
    level = "="
    while any(f"]{level}]" in b for b in bodies):  # a long bracket no body closes
        level += "="
    quoted = ",\n".join(f"[{level}[{b}]{level}]" for b in bodies)
    return WRK_SCRIPT.replace("{BODIES}", "{\n" + quoted + "\n}")


def wrk_load(
    url: str, texts: list[str], clients: int, body: dict[str, Any], seconds: int
) -> dict[str, Any]:
    """`clients` connections from one wrk thread for `seconds`, one request a text in turn."""
    if shutil.which("wrk") is None:
        raise SystemExit("--client wrk needs wrk on the PATH (apt-get install wrk)")
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "load.lua"
        script.write_text(wrk_script(texts, body), encoding="utf-8")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        command = ["wrk", "-t1", f"-c{clients}", f"-d{seconds}s", "--timeout", "120s"]
        done = subprocess.run(
            [*command, "-s", str(script), url + "/translate"], capture_output=True, text=True
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"wrk failed ({done.returncode}): {done.stderr.strip() or done.stdout}")
    row = json.loads(lines[-1])
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {
        "clients": clients,
        "requests": row["requests"],
        "seconds": row["seconds"],
        "requests_per_s": row["requests"] / row["seconds"],
        "sentences_per_s": row["requests"] / row["seconds"],
        "p50_ms": row["p50_ms"],
        "p99_ms": row["p99_ms"],
        "errors": row["errors"],
        "client_cpu_ms": 1000 * cpu / max(row["requests"], 1),
    }


def engine_alone(args: argparse.Namespace, texts: list[str], widths: list[int]) -> list[float]:
    """The engine's own sentences/s on batches of each width, in this process before the
    server starts, on the server's threads: what that many clients, one sentence each, can
    at most be served at."""
    import torch

    from qkv.inference.translator import Translator

    torch.set_num_threads(args.threads)
    translator = Translator.load(args.run, engine=args.engine, quantize=args.quantize)
    translator.hypotheses(texts[:8], beam_size=args.beam)  # warm-up
    rates = []
    for width in widths:
        start = time.perf_counter()
        for i in range(0, len(texts), width):
            translator.hypotheses(texts[i : i + width], beam_size=args.beam)
        rates.append(len(texts) / (time.perf_counter() - start))
    return rates


def table(rows: list[dict[str, Any]], title: str) -> str:
    lines = [
        f"{title}",
        "",
        "| clients | requests | req/s | sent/s | engine alone sent/s | p50 ms | p99 ms | errors "
        "| CPU ms a request, server / clients | peak RSS MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        alone = r.get("engine_alone_sentences_per_s")
        lines.append(
            f"| {r['clients']} | {r['requests']} | {r['requests_per_s']:.1f} | "
            f"{r['sentences_per_s']:.1f} | {'—' if alone is None else f'{alone:.1f}'} | "
            f"{r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['errors']} | "
            f"{r['server_cpu_ms']:.1f} / {r['client_cpu_ms']:.1f} | {r['peak_rss_mb']:.0f} |"
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
    parser.add_argument("--client", default="httpx", choices=["httpx", "wrk"])
    parser.add_argument("--seconds", type=int, default=15, help="a client count's time, wrk")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--engine-alone",
        action="store_true",
        help="first time the engine in this process on batches as wide as each client count",
    )
    args = parser.parse_args()
    texts = sentences(args.data, args.requests)
    counts = [int(c) for c in args.clients.split(",")]
    alone = engine_alone(args, texts, counts) if args.engine_alone else [None] * len(counts)
    port = free_port()
    server = start_server(args, port)
    url = f"http://127.0.0.1:{port}"
    rows = []
    try:
        body = {"beam": args.beam}
        asyncio.run(load(url, texts[:8], 2, body))  # warm-up
        for clients, rate in zip(counts, alone, strict=True):
            server_cpu, client_cpu = cpu_seconds(server.pid), time.process_time()
            if args.client == "wrk":
                row = wrk_load(url, texts, clients, body, args.seconds)
            else:
                row = asyncio.run(load(url, texts, clients, body))
                row["client_cpu_ms"] = 1000 * (time.process_time() - client_cpu) / len(texts)
            server_seconds = cpu_seconds(server.pid) - server_cpu
            row["server_cpu_ms"] = 1000 * server_seconds / max(row["requests"], 1)
            row["peak_rss_mb"] = peak_rss_mb(server.pid)
            row["engine_alone_sentences_per_s"] = rate
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)
    engine = args.engine + (f" {args.quantize}" if args.quantize else "")
    title = f"`qkv serve`, {engine} engine, beam {args.beam}, {args.threads} threads, {args.client}"
    print(table(rows, title))
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args), "rows": rows}, default=str, indent=2))


if __name__ == "__main__":
    main()
