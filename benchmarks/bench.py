"""Speed of qkv against existing PyTorch encoder-decoder Transformers, like for like.

    python benchmarks/bench.py --json bench.json --md bench.md \\
        [--peers torch_nn,hf_marian,xtransformers,xtransformers_flash,ct2_float32,ct2_int8] \\
        [--threads 2] [--baseline ../old-checkout [--baseline-label OLD]] [--quick]

Every system has the same shape (d_model 256, 4 heads, d_ff 1024, 3 + 3 layers, dropout 0.1,
attention dropout 0.0, separate 8,000-token vocabularies), trains on the identical batches
and decodes the same sources. Each measurement runs in a fresh worker process with `--threads`
torch threads, the same environment and glibc's allocator tuned alike (`tune_allocator`): the
matmul peak, each system's training, each system's decoding in `--decode-rounds` rounds
(`decode_in_rounds`), then qkv interleaved step by step with the fastest peer, and pass by pass
with Hugging Face's `generate` (`phases.phase_pair`). Greedy decoding's headline gives every
system `--split` batches at once, each in a worker thread (what `qkv translate` does on a
CPU); one batch at a time, as the peers ship, is measured beside it.

`--baseline TREE` adds the qkv of another source tree as one more system, built by that tree's
own `benchmarks/qkv_side.py` with `TREE/src` first on its workers' PYTHONPATH; the report gives
this tree's figures over the baseline's. Peers that are not installed are skipped with a note.
The CTranslate2 peers decode only: their training phase is not run.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)  # the source tree whose qkv is "qkv"
sys.path.insert(0, HERE)

import report  # noqa: E402
from peers import PEERS, QKV_PEERS, available, trainable  # noqa: E402

BEST_PROBE = {"gflops": 0.0}  # the best 1024^3 probe of this run: what an idle core gives
# The decoding comparisons name Hugging Face's `generate`, the one peer with beam search too.
TARGET_PEER = "hf_marian"
QKV = "qkv"

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
ALLOCATOR = "glibc mallopt: mmap threshold 1 GiB, trim threshold 2 GiB, one arena"


def tune_allocator() -> bool:
    """glibc's allocator as qkv's trainer and `qkv translate` set it up for themselves, here in
    every worker process, whichever system it measures: freed large blocks are kept instead of
    returned to the kernel, in one arena for all threads. Returns whether glibc took it."""
    name = ctypes.util.find_library("c")
    if name is None or os.name != "posix":
        return False
    try:
        libc = ctypes.CDLL(name)
        done = [
            libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30),
            libc.mallopt(_M_TRIM_THRESHOLD, 1 << 31),
            libc.mallopt(_M_ARENA_MAX, 1),
        ]
    except (OSError, AttributeError):
        return False
    return all(done)


def run_phase(phase: str, args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    """Run one measurement in a fresh process (in this one with --inline, except a baseline's)
    and time it.

    Before it, wait (up to --quiet-wait s) for other processes to leave the CPUs idle. Run it
    again (up to --retries times) when its matmul probe fell below 0.75 x the best probe: another
    process held a core while it ran (on the CPU only).
    """
    job = dict(vars(args), phase=phase, **extra)
    label = ":".join(str(x) for x in (phase, *extra.values()))
    inline = args.inline and tree_of(job) in (None, ROOT)
    contended_runs = []
    for attempt in range(args.retries + 1):
        waited = wait_for_quiet(args, label)
        before = machine_load(args.load_interval)
        start = time.perf_counter()
        result = run_job(job) if inline else run_subprocess(job, label)
        result["wall_s"] = time.perf_counter() - start
        result["load_before"], result["load_after"] = before, machine_load(args.load_interval)
        result["waited_for_quiet_s"] = waited
        probes = result.get("probe_gflops") or [BEST_PROBE["gflops"]]
        BEST_PROBE["gflops"] = max(BEST_PROBE["gflops"], *probes)
        # A GPU's probe is too short to time reliably, and the GPU is not shared: no re-runs.
        result["contended"] = args.device == "cpu" and min(probes) < 0.75 * BEST_PROBE["gflops"]
        print(
            f"[{label}] {result['wall_s']:.0f} s, probe {min(probes):.0f}-{max(probes):.0f}"
            f" GFLOP/s" + (" (contended)" if result["contended"] else ""),
            file=sys.stderr,
            flush=True,
        )
        if not result["contended"] or "error" in result or attempt == args.retries:
            break
        contended_runs.append({"probe_gflops": probes, "wall_s": result["wall_s"]})
    result["contended_runs"] = contended_runs
    return result


def tree_of(job: dict[str, Any]) -> str | None:
    """The source tree whose qkv a phase imports (None: no qkv): this tree's for the pairs and
    the peers exported from its model (`QKV_PEERS`)."""
    trees = job.get("qkv_trees") or {}
    if job["phase"] == "pair" or job.get("system") in QKV_PEERS:
        return trees.get(QKV)
    return trees.get(job.get("system", ""))


def wait_for_quiet(args: argparse.Namespace, label: str) -> float:
    """Seconds waited for the share of CPUs busy with other processes to fall under 15 %."""
    waited = 0.0
    while waited < args.quiet_wait:
        load = machine_load(1.0)
        if not load or load["busy"] < 0.15:
            break
        if waited == 0:
            print(
                f"[{label}] CPUs {100 * load['busy']:.0f} % busy with other processes: waiting",
                file=sys.stderr,
                flush=True,
            )
        time.sleep(4.0)
        waited += 5.0
    return waited


def worker_env(job: dict[str, Any]) -> dict[str, str]:
    """The same environment for every worker; a qkv tree's `src` first on PYTHONPATH."""
    threads = str(job["threads"])
    env = dict(
        os.environ,
        OMP_NUM_THREADS=threads,
        MKL_NUM_THREADS=threads,
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
    )
    tree = tree_of(job)
    if tree is not None:
        paths = [os.path.join(tree, "src"), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def run_subprocess(job: dict[str, Any], label: str) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(job, handle)
        job_path = handle.name
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker", job_path],
        env=worker_env(job),
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        if done.returncode != 0:
            tail = done.stderr[-2000:]
            print(f"[{label}] failed (rc {done.returncode})\n{tail}", file=sys.stderr)
            return {"error": f"rc={done.returncode}", "stderr_tail": tail}
        with open(job_path + ".out") as handle:
            return json.load(handle)  # type: ignore[no-any-return]
    finally:
        for path in (job_path, job_path + ".out"):
            if os.path.exists(path):
                os.unlink(path)


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """One phase, in this process: the allocator tuned, then `--threads` torch threads."""
    tuned = tune_allocator()
    import torch
    from phases import phase_decode, phase_pair, phase_peak, phase_train

    measure = {
        "peak": phase_peak,
        "train": phase_train,
        "decode": phase_decode,
        "pair": phase_pair,
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(job["threads"])
    try:
        result = measure[job["phase"]](argparse.Namespace(**job))
    finally:
        torch.set_num_threads(threads)
    result["allocator_tuned"] = tuned
    return result


def machine_load(interval: float) -> dict[str, float]:
    """Load average and the fraction of all CPUs busy (with other processes: the driver sleeps)."""

    def cpu_times() -> list[int]:
        with open("/proc/stat") as handle:
            return [int(x) for x in handle.readline().split()[1:]]

    try:
        first = cpu_times()
        time.sleep(interval)
        delta = [b - a for a, b in zip(first, cpu_times(), strict=True)]
        with open("/proc/loadavg") as handle:
            load1 = float(handle.read().split()[0])
    except OSError:
        return {}
    return {"loadavg_1m": load1, "busy": 1.0 - (delta[3] + delta[4]) / max(sum(delta[:8]), 1)}


def greedy_speed(result: dict[str, Any]) -> float | None:
    return result.get("greedy", {}).get("sentences_per_s")


def best(results: dict[str, Any], peers: list[str], key: Any) -> str | None:
    found = {p: key(results[p]) for p in peers if p in results and key(results[p])}
    return max(found, key=lambda p: found[p]) if found else None


def main_run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    wanted = [p for p in args.peers.split(",") if p]
    unknown = [p for p in wanted if p not in PEERS]
    if unknown:
        raise SystemExit(f"unknown peers {unknown}; known: {', '.join(PEERS)}")
    peers = [p for p in wanted if available(p)]
    started = time.perf_counter()
    results: dict[str, Any] = {
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join(["python benchmarks/bench.py", *argv]),
        "args": vars(args),
        "versions": versions(),
        "trees": {name: tree_info(path) for name, path in args.qkv_trees.items()},
        "baselines": [s for s in args.qkv_trees if s != QKV],
        "allocator": ALLOCATOR,
        "load_start": machine_load(2 * args.load_interval),
        "skipped_peers": [p for p in wanted if p not in peers],
        "decode_only": [p for p in peers if not trainable(p)],
        "systems": {},
    }
    results["peak"] = run_phase("peak", args)
    systems = [*args.qkv_trees, *peers]
    trains = [s for s in systems if s not in results["decode_only"]]
    train = {} if args.no_train else {s: run_phase("train", args, system=s) for s in trains}
    decode = {} if args.no_decode else decode_in_rounds(args, systems)
    for s in systems:
        results["systems"][s] = {"train": train.get(s, {}), "decode": decode.get(s, {})}
    pairs = []
    fastest_train = best(train, peers, lambda r: r.get("identical", {}).get("tgt_tokens_per_s"))
    if fastest_train and not args.no_pair:
        pairs.append(run_phase("pair", args, peer=fastest_train, pair_part="train"))
    decode_peer = TARGET_PEER if TARGET_PEER in peers else best(decode, peers, greedy_speed)
    if decode_peer and not args.no_decode and not args.no_pair:
        pairs.append(run_phase("pair", args, peer=decode_peer, pair_part="decode"))
    results["pairs"] = pairs
    results["load_end"] = machine_load(2 * args.load_interval)
    results["total_wall_s"] = time.perf_counter() - started
    return results


def decode_in_rounds(args: argparse.Namespace, systems: list[str]) -> dict[str, dict[str, Any]]:
    """Each system's decoding phase `--decode-rounds` times, in a fresh process each time.

    The systems take turns, the qkv ones and `TARGET_PEER` side by side, in reverse order every
    other round: a slow stretch of the host, which lasts minutes, then falls on every system
    alike, where one phase each would leave it on whichever ran in it. The rounds of a system
    are merged by `merge_rounds`.
    """
    trees = args.qkv_trees
    order = sorted(systems, key=lambda s: (s not in trees, s != TARGET_PEER))  # stable
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    for index in range(args.decode_rounds):
        for system in order if index % 2 == 0 else order[::-1]:
            runs[system].append(run_phase("decode", args, system=system))
    return {s: merge_rounds(r) for s, r in runs.items()}


PEAK_MEMORY = ("peak_rss_mb", "peak_rss_mb_greedy", "peak_device_mb", "peak_device_mb_greedy")


def merge_rounds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One system's decoding phases (one a round) -> one result: each way's speed from the
    median of every timed pass of every round, with each round's own speed beside it
    ("rounds"); the highest peak memory of any round; contended when any round was. A failed
    round is the result."""
    failed = [r for r in runs if "error" in r]
    if failed:
        return failed[0]
    first, sentences = runs[0], runs[0]["sentences"]
    merged = dict(first, rounds=len(runs), load_after=runs[-1].get("load_after"))
    for kind in ("greedy", "beam"):
        if kind not in first:
            continue
        ways = {}
        for way, figures in first[kind]["ways"].items():
            seconds = [x for r in runs for x in r[kind]["ways"][way]["seconds"]]
            ways[way] = dict(
                figures,
                seconds=seconds,
                sentences_per_s=sentences / statistics.median(seconds),
                rounds=[r[kind]["ways"][way]["sentences_per_s"] for r in runs],
            )
        headline = ways[first[kind]["headline"]]
        merged[kind] = dict(
            first[kind],
            ways=ways,
            sentences_per_s=headline["sentences_per_s"],
            rounds=headline["rounds"],
        )
    for key in PEAK_MEMORY:
        if key in first:
            merged[key] = max(r[key] for r in runs)
    for key in ("probe_gflops", "contended_runs"):
        merged[key] = [x for r in runs for x in r.get(key, [])]
    for key in ("wall_s", "waited_for_quiet_s"):
        merged[key] = sum(r.get(key, 0.0) for r in runs)
    merged["contended"] = any(r.get("contended") for r in runs)
    return merged


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for package in ("torch", "transformers", "x-transformers", "ctranslate2", "numpy"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next(x for x in handle if x.startswith("model name")).split(":", 1)[1].strip()
    except (OSError, StopIteration):
        cpu = platform.processor()
    found["cpu"] = f"{cpu}, {os.cpu_count()} logical CPUs"
    return found


def tree_info(path: str) -> dict[str, Any]:
    """A qkv source tree: its path, commit and whether tracked files differ from it."""

    def git(*command: str) -> str:
        done = subprocess.run(
            ["git", "-C", path, *command], capture_output=True, text=True, check=False
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or None
    dirty = bool(git("status", "--porcelain", "--untracked-files=no")) if commit else None
    return {"path": path, "commit": commit, "dirty": dirty}


QUICK = {
    "warmup": 1,
    "steps": 3,
    "repeats": 1,
    "sentences": 64,
    "decode_repeats": 1,
    "decode_rounds": 1,
}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated peers")
    parser.add_argument("--json", default="bench.json", help="write the results here")
    parser.add_argument("--md", default="bench.md", help="write the markdown report here")
    parser.add_argument(
        "--baseline",
        metavar="TREE",
        help="a qkv source tree (TREE/src/qkv, TREE/benchmarks/qkv_side.py) measured as one "
        "more system, in processes of its own",
    )
    parser.add_argument(
        "--baseline-label",
        metavar="LABEL",
        help="names the baseline qkv@LABEL (default: its git commit, else its folder's name)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--split",
        type=int,
        help="greedy batches every system decodes at once in the headline, each in a worker "
        "thread of --threads/N torch threads (default: --threads, as `qkv translate`; CPU only; "
        "1: one batch at a time)",
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--dtype",
        choices=["fp32", "bf16"],
        default="fp32",
        help="bf16: every system trains under torch.autocast and decodes with its weights in bf16; "
        "the peak measured in bf16",
    )
    parser.add_argument("--shape", choices=["base", "tiny"], default="base")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--warmup", type=int, default=3, help="untimed training steps")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes; median kept")
    parser.add_argument("--batch-tokens", type=int, default=2000)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--sentences", type=int, default=256, help="sentences to decode")
    parser.add_argument("--infer-batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=50)
    parser.add_argument(
        "--decode-repeats",
        type=int,
        default=3,
        help="timed greedy passes of each way per decoding phase (beam search: half as many)",
    )
    parser.add_argument(
        "--decode-rounds",
        type=int,
        default=5,
        help="decoding phases per system, the systems taking turns (`decode_in_rounds`)",
    )
    parser.add_argument("--beam", type=int, default=5, help="beam width; 0 skips beam search")
    parser.add_argument("--no-pair", action="store_true", help="skip the interleaved A/B runs")
    parser.add_argument("--no-decode", action="store_true", help="measure training only")
    parser.add_argument("--no-train", action="store_true", help="measure decoding only")
    parser.add_argument(
        "--no-cuda-graphs",
        action="store_true",
        help="qkv decodes eagerly on a GPU too (default: one CUDA graph replay per step)",
    )
    parser.add_argument(
        "--probe-size",
        type=int,
        default=1024,
        help="n of the n^3 matmul that checks, in each phase, that no core is taken",
    )
    parser.add_argument(
        "--load-interval",
        type=float,
        default=0.5,
        help="seconds of /proc/stat sampling before and after each phase",
    )
    parser.add_argument("--retries", type=int, default=2, help="re-runs of a contended phase")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=300,
        help="most seconds to wait, before each phase, for other processes to go idle",
    )
    parser.add_argument("--quick", action="store_true", help="few steps: a smoke check")
    parser.add_argument(
        "--inline",
        action="store_true",
        help="measure in this process (tests; a baseline's phases still run in processes of "
        "their own); default: a fresh one per phase",
    )
    args = parser.parse_args(argv)
    if args.decode_rounds < 1 or args.decode_repeats < 1:
        parser.error("--decode-rounds and --decode-repeats must be at least 1")
    if args.split is None:
        args.split = args.threads
    if args.split < 1:
        parser.error("--split must be at least 1")
    args.qkv_trees = {QKV: ROOT}
    if args.baseline:
        tree = os.path.realpath(args.baseline)
        for needed in ("src/qkv", "benchmarks/qkv_side.py"):
            if not os.path.exists(os.path.join(tree, needed)):
                parser.error(f"--baseline {args.baseline}: no {needed} there")
        label = args.baseline_label or tree_info(tree)["commit"] or os.path.basename(tree)
        name = f"{QKV}@{label}"
        if name in PEERS:
            parser.error(f"--baseline-label {label}: the name {name} is taken")
        args.qkv_trees[name] = tree
    elif args.baseline_label:
        parser.error("--baseline-label needs --baseline")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device is visible to torch")
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    return args


def main(argv: list[str]) -> None:
    if argv[:1] == ["--worker"]:
        with open(argv[1]) as handle:
            result = run_job(json.load(handle))
        with open(argv[1] + ".out", "w") as handle:
            json.dump(result, handle)
        return
    args = parse(argv)
    results = main_run(args, argv)
    with open(args.json, "w") as handle:
        json.dump(results, handle, indent=1)
    markdown = report.render(results)
    with open(args.md, "w") as handle:
        handle.write(markdown)
    print(markdown)


if __name__ == "__main__":
    main(sys.argv[1:])
