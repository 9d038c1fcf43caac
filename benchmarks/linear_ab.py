"""qkv's training step with its linear layers in oneDNN and in `F.linear` (MKL), interleaved.

Two copies of the benchmark model with the same initial weights take turns, step by step, on
the same Multi30k-shaped batches (who goes first alternates), each with its own optimiser;
everything else is qkv's training step (`QkvSystem.loss`, fused AdamW, `tune_allocator`). The
"off" way turns `qkv.model.linear` off, so that every linear layer is `F.linear`. Prints the
target tokens per second of each, their ratio, the median ratio of paired steps, and each
way's last loss (equal up to float rounding).

    python benchmarks/linear_ab.py [--threads 2] [--steps 20] [--shape base]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from phases import build, n_targets, train_batches
from workload import SHAPES

import qkv.model.linear as qkv_linear
from qkv.training.speed import tune_allocator


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Print the comparison; return target tokens per second of each way and the losses."""
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
    systems = {"onednn": build("qkv", shape), "f_linear": build("qkv", shape)}
    systems["f_linear"].model.load_state_dict(systems["onednn"].model.state_dict())
    optimizers = {name: system.optimizer(args.lr) for name, system in systems.items()}
    seconds: dict[str, list[float]] = {name: [] for name in systems}
    losses: dict[str, float] = {}
    applies = qkv_linear._applies
    batches = train_batches(args, shape)
    try:
        for i, batch in enumerate(batches):
            for name in sorted(systems, reverse=i % 2 == 1):
                qkv_linear._applies = applies if name == "onednn" else _never  # type: ignore[assignment]
                system, optimizer = systems[name], optimizers[name]
                system.model.train()
                start = time.perf_counter()
                optimizer.zero_grad(set_to_none=True)
                loss = system.loss(batch["src"], batch["tgt_in"], batch["labels"])
                loss.backward()
                optimizer.step()
                losses[name] = float(loss.detach())
                seconds[name].append(time.perf_counter() - start)
    finally:
        qkv_linear._applies = applies  # type: ignore[assignment]
    tokens = n_targets(batches[args.warmup :])
    timed = {name: s[args.warmup :] for name, s in seconds.items()}
    rate = {name: tokens / sum(s) for name, s in timed.items()}
    paired = zip(timed["f_linear"], timed["onednn"], strict=True)
    pairs = statistics.median(a / b for a, b in paired)
    print(
        f"F.linear {rate['f_linear']:,.0f} tok/s, oneDNN {rate['onednn']:,.0f} tok/s: "
        f"oneDNN / F.linear {rate['onednn'] / rate['f_linear']:.3f} (median pair {pairs:.3f}); "
        f"last loss {losses['f_linear']:.4f} and {losses['onednn']:.4f}"
    )
    return {"tokens_per_s": rate, "median_pair_ratio": pairs, "last_loss": losses}


def _never(*_: object) -> bool:
    return False


if __name__ == "__main__":
    main()
