"""Decoding in worker threads (`qkv translate --workers`), qkv and a peer side by side.

Each system decodes the benchmark's batches in two ways: one batch at a time on `--threads`
torch threads, and `--threads` batches at once, each in a worker thread of one torch thread,
by qkv's `map_in_workers` (what qkv's decode phase runs, `--workers 0`). The peer goes
through the same `map_in_workers`, so the split is compared with the split. The four ways
alternate pass by pass (forward, then backward), in one process, so that load from other
processes hits all alike; a pass decodes every batch, the workers' start included.
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
            system.greedy(batches[0][:4], 3)  # warm-up; its decoding weights serve the workers
    for kind, run in kinds.items():
        seconds: dict[Way, list[float]] = {way: [] for way in ways}
        for repeat in range(args.decode_repeats):
            for way in ways if repeat % 2 == 0 else ways[::-1]:
                job = decoding_job(systems[way[0]], run, batches, args)
                start = time.perf_counter()
                list(map_in_workers(job, len(batches), way[1]))
                seconds[way].append(time.perf_counter() - start)
        result[kind] = [
            {
                "system": name,
                "workers": workers,
                "threads_each": args.threads if workers == 1 else 1,
                "sentences_per_s": sentences / statistics.median(seconds[(name, workers)]),
                "seconds": seconds[(name, workers)],
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
) -> Callable[[int], None]:
    """Decode batch i and check its shape."""

    def job(index: int) -> None:
        batch = batches[index]
        with torch.inference_mode(), decoding_autocast(system, args):
            out = run(system, batch)
        assert out.shape == (batch.size(0), args.new_tokens), (tuple(out.shape), args.new_tokens)

    return job


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
