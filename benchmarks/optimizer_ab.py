"""qkv's training step with AdamW's `foreach` path against its fused kernel, interleaved.

Two copies of the benchmark model with the same initial weights take turns, step by step, on
the same Multi30k-shaped batches (who goes first alternates), each with its own optimiser;
everything else is qkv's training step (`QkvSystem.loss`, `tune_allocator`). Prints the target
tokens per second of each, their ratio, and the median ratio of paired steps.

    python benchmarks/optimizer_ab.py [--threads 2] [--steps 20] [--shape base]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from phases import build, n_targets, train_batches
from workload import SHAPES

from qkv.training.speed import tune_allocator


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Print the comparison; return target tokens per second of each optimiser."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shape", choices=["base", "tiny"], default="base")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-tokens", type=int, default=2000)
    parser.add_argument("--lr", type=float, default=1e-4)
    args = parser.parse_args(argv)
    args.device, args.dtype = "cpu", "fp32"
    torch.set_num_threads(args.threads)
    tune_allocator()
    shape = SHAPES[args.shape]
    torch.manual_seed(args.seed)
    systems = {"foreach": build("qkv", shape), "fused": build("qkv", shape)}
    systems["fused"].model.load_state_dict(systems["foreach"].model.state_dict())
    model = systems["foreach"].model
    optimizers = {
        "foreach": torch.optim.AdamW(
            model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-9, foreach=True
        ),
        "fused": systems["fused"].optimizer(args.lr),  # what the trainer uses
    }
    assert optimizers["fused"].param_groups[0]["fused"]
    seconds: dict[str, list[float]] = {name: [] for name in systems}
    batches = train_batches(args, shape)
    for i, batch in enumerate(batches):
        for name in sorted(systems, reverse=i % 2 == 1):
            system, optimizer = systems[name], optimizers[name]
            system.model.train()
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            system.loss(batch["src"], batch["tgt_in"], batch["labels"]).backward()
            optimizer.step()
            seconds[name].append(time.perf_counter() - start)
    tokens = n_targets(batches[args.warmup :])
    timed = {name: s[args.warmup :] for name, s in seconds.items()}
    rate = {name: tokens / sum(s) for name, s in timed.items()}
    pairs = statistics.median(a / b for a, b in zip(timed["foreach"], timed["fused"], strict=True))
    print(
        f"foreach {rate['foreach']:,.0f} tok/s, fused {rate['fused']:,.0f} tok/s: "
        f"fused / foreach {rate['fused'] / rate['foreach']:.3f} (median pair {pairs:.3f})"
    )
    return rate


if __name__ == "__main__":
    main()
