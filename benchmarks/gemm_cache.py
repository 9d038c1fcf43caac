"""Why a greedy step's matmuls run at half the matmul peak: the weights do not stay in cache.

Times the 19 matmuls of one greedy decoding step of the benchmark model (64 rows: per decoder
layer the q/k/v, cross-attention query, two attention output and two feed-forward projections,
then the output layer) three ways, best of several passes:

- one at a time: each matmul repeated alone, its weight hot in cache; the times summed;
- in sequence: the 19 in a step's order, each weight evicted by the others before its turn;
- in sequence with the caches read: as decoding does, the bytes of a mid-length step's
  self- and cross-attention keys and values read after each layer's matmuls (the time of
  those reads alone subtracted).

    python benchmarks/gemm_cache.py [--threads 2] [--rows 64] [--shape base]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F
from phases import best_ms
from torch import Tensor
from workload import SHAPES, Shape

MID_STEP = 25
"""Target positions in the self-attention caches at a mid-length step of 50."""

SOURCE_LENGTH = 22
"""Padded source length of a benchmark batch."""


def step_weights(shape: Shape) -> list[list[tuple[Tensor, Tensor]]]:
    """(weight (out, in), bias (out,)) of each matmul of a step, grouped by decoder layer; the
    output layer is the last group."""
    d, f = shape.d_model, shape.d_ff
    layer = [(3 * d, d), (d, d), (d, d), (d, d), (f, d), (d, f)]
    groups = [
        [(torch.randn(o, i), torch.randn(o)) for o, i in layer]
        for _ in range(shape.n_decoder_layers)
    ]
    groups.append([(torch.randn(shape.tgt_vocab, d), torch.zeros(shape.tgt_vocab))])
    return groups


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Print the table; return milliseconds per way of running the matmuls."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--shape", choices=["base", "tiny"], default="base")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shape = SHAPES[args.shape]
    groups = step_weights(shape)
    inputs = {n: torch.randn(args.rows, n) for n in (shape.d_model, shape.d_ff)}
    matmuls = [(inputs[w.size(1)], w, b) for group in groups for w, b in group]
    flops = sum(2 * x.size(0) * w.size(0) * w.size(1) for x, w, _ in matmuls)
    heads_width = shape.d_model  # H * K
    per_layer = args.rows * heads_width * 2 * (MID_STEP + SOURCE_LENGTH)  # keys and values
    caches = [torch.randn(per_layer) for _ in range(shape.n_decoder_layers)]

    def sequence(read_caches: bool) -> Callable[[], None]:
        def run() -> None:
            for g, group in enumerate(groups):
                for w, b in group:
                    F.linear(inputs[w.size(1)], w, b)
                if read_caches and g < len(caches):
                    caches[g].sum()

        return run

    def read_only() -> None:
        for cache in caches:
            cache.sum()

    alone = sum(best_ms(lambda x=x, w=w, b=b: F.linear(x, w, b), calls=50) for x, w, b in matmuls)
    in_sequence = best_ms(sequence(False))
    with_caches = best_ms(sequence(True)) - best_ms(read_only)
    cache_mb = sum(c.numel() for c in caches) * 4 / 2**20
    weight_mb = sum(w.numel() for _, w, _ in matmuls) * 4 / 2**20
    print(
        f"{len(matmuls)} matmuls of {args.rows} rows, {weight_mb:.1f} MB of weights; "
        f"{cache_mb:.1f} MB of keys and values"
    )
    ways = {
        "one at a time (summed)": alone,
        "in sequence": in_sequence,
        "in sequence, caches read between layers": with_caches,
    }
    print("| how | ms | GFLOP/s | vs one at a time |")
    print("|---|---:|---:|---:|")
    for name, ms in ways.items():
        print(f"| {name} | {ms:.2f} | {flops / ms / 1e6:.0f} | {ms / alone:.2f}× |")
    return ways


if __name__ == "__main__":
    main()
