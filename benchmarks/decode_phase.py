"""Decoding only: qkv with and without CUDA graphs beside a peer, in one process.

The decode phase of `bench.py` (batch `--infer-batch`, exactly `--new-tokens` tokens, greedy
and beam search, median of `--decode-repeats` passes), run for each dtype and system in turn:

    python benchmarks/decode_phase.py --device cuda [--dtypes bf16,fp32] [--peer hf_marian]

Every other option is `bench.py`'s (`--infer-batch`, `--new-tokens`, `--beam`, `--shape`, ...),
with its defaults, except that `--device` defaults to cuda here. On a CPU, qkv never uses
graphs, and both qkv rows measure the same decoder.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import bench
from phases import phase_decode


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for dtype in args.dtypes.split(","):
        for system, graphs in (("qkv", True), ("qkv", False), (args.peer, True)):
            job = argparse.Namespace(
                **{**vars(args), "system": system, "dtype": dtype, "no_cuda_graphs": not graphs}
            )
            start = time.perf_counter()
            result = phase_decode(job)
            label = system if system != "qkv" else f"qkv, {'graphs' if graphs else 'eager'}"
            rows.append(
                {
                    "dtype": dtype,
                    "system": label,
                    "greedy": result["greedy"]["sentences_per_s"],
                    "beam": result.get("beam", {}).get("sentences_per_s"),
                    "wall_s": time.perf_counter() - start,
                }
            )
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict[str, Any]], peer: str) -> list[str]:
    lines = [
        f"| dtype | system | greedy sent/s | beam sent/s | greedy ×{peer} | beam ×{peer} |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        base = next(r for r in rows if r["dtype"] == row["dtype"] and r["system"] == peer)
        beam = f"{row['beam']:.1f}" if row["beam"] else "—"
        beam_ratio = f"{row['beam'] / base['beam']:.2f}" if row["beam"] and base["beam"] else "—"
        lines.append(
            f"| {row['dtype']} | {row['system']} | {row['greedy']:.1f} | {beam} "
            f"| {row['greedy'] / base['greedy']:.2f} | {beam_ratio} |"
        )
    return lines


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--peer", default="hf_marian")
    own, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    args = bench.parse(["--device", "cuda", *rest])  # a --device in `rest` comes last and wins
    args.dtypes, args.peer = own.dtypes, own.peer
    rows = measure(args)
    print("\n".join(table(rows, args.peer)))
    return rows


if __name__ == "__main__":
    main()
