"""Decoding in worker processes (`qkv translate --workers`), qkv and a peer side by side.

Each system decodes the benchmark's batches in two ways: in one process on `--threads` torch
threads, as in the decode phase, and spread over `--threads` forked workers of one thread each
by qkv's `map_in_workers`. The peer goes through the same `map_in_workers`, so the split is
compared with the split. The four ways alternate pass by pass (forward, then backward), in one
process, so that load from other processes hits all alike; a pass decodes every batch, and
the workers' start-up (fork, first step) is timed in it, as a user pays it on each call.
Also kept: the memory each worker holds of its own (private pages) after its batch.
`bench.py` runs it after the decode phases; on its own, with `bench.py`'s options:

    python benchmarks/workers_phase.py [--peer hf_marian] [--threads 2] [--beam 5] ...
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import bench
import report
import torch
from phases import (
    build,
    decode_batches,
    decoding_autocast,
    decoding_kinds,
    for_decoding,
    probe_gflops,
)
from workload import SHAPES

from qkv.inference.workers import map_in_workers

Way = tuple[str, int]  # (system, workers)


def phase_workers(args: Any) -> dict[str, Any]:
    shape = SHAPES[args.shape]
    torch.manual_seed(args.seed)
    probes = [probe_gflops(args.probe_size, args)]
    systems = {name: build(name, shape, args) for name in ("qkv", args.peer)}
    batches = decode_batches(args, shape)
    sentences = sum(b.size(0) for b in batches)
    kinds = decoding_kinds(args, list(systems.values()))
    ways: list[Way] = [(name, w) for name in systems for w in (1, args.threads)]
    result: dict[str, Any] = {"peer": args.peer, "workers": args.threads, "sentences": sentences}
    for system in systems.values():
        for_decoding(system, args)
        with torch.inference_mode(), decoding_autocast(system, args):
            system.greedy(batches[0][:4], 3)  # warm-up, inherited by the workers
    for kind, run in kinds.items():
        seconds: dict[Way, list[float]] = {way: [] for way in ways}
        private: dict[Way, float] = {}
        for repeat in range(args.decode_repeats):
            for way in ways if repeat % 2 == 0 else ways[::-1]:
                split = way[1] > 1
                job = decoding_job(systems[way[0]], run, batches, args, split)
                start = time.perf_counter()
                found = list(map_in_workers(job, len(batches), way[1]))
                seconds[way].append(time.perf_counter() - start)
                if split:
                    private[way] = max(private.get(way, 0.0), *found)
        result[kind] = [
            {
                "system": name,
                "workers": workers,
                "threads_each": args.threads if workers == 1 else 1,
                "sentences_per_s": sentences / statistics.median(seconds[(name, workers)]),
                "seconds": seconds[(name, workers)],
                "worker_private_mb": private.get((name, workers)),
            }
            for name, workers in ways
        ]
        probes.append(probe_gflops(args.probe_size, args))
    result["probe_gflops"] = probes
    return result


def decoding_job(
    system: Any,
    run: Callable[[Any, torch.Tensor], torch.Tensor],
    batches: list[torch.Tensor],
    args: Any,
    in_worker: bool,
) -> Callable[[int], float]:
    """Decode batch i and check its shape; in a worker, return the worker's private memory in
    MB (0 in this process, whose memory is the decode phase's to measure)."""

    def job(index: int) -> float:
        batch = batches[index]
        with torch.inference_mode(), decoding_autocast(system, args):
            out = run(system, batch)
        assert out.shape == (batch.size(0), args.new_tokens), (tuple(out.shape), args.new_tokens)
        return private_mb() if in_worker else 0.0

    return job


def private_mb() -> float:
    """Pages of this process's own, not shared with any other (Linux), in MB; 0 elsewhere."""
    try:
        with open("/proc/self/smaps_rollup") as handle:
            fields = dict(line.split(":", 1) for line in handle if ":" in line)
    except OSError:
        return 0.0
    kib = sum(int(fields.get(k, "0 kB").split()[0]) for k in ("Private_Clean", "Private_Dirty"))
    return kib / 1024


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--peer", default="hf_marian")
    own, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    job = dict(vars(bench.parse(rest)), phase="workers", peer=own.peer)
    result = bench.run_job(job)
    print("\n".join(report.workers({"workers": result})))
    return result


if __name__ == "__main__":
    main()
