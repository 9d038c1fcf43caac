"""Where a qkv training step goes once the process is warm: wall-clock ms per step, by part.

The parts are timed with `time.perf_counter` around the functions that do them, on the
benchmark's identical batches, after warm-up steps that let the heap reach its size (no
profiler: it, and the first steps, whose new heap pages fault, inflate the big elementwise
operations two- to fivefold). The loss's backward is timed from the start of the backward to
the moment the logits' gradient is made.

    python benchmarks/step_parts.py [--threads 2] [--warmup 10] [--steps 20] [--peak 431.2]

With `--peak` (GFLOP/s, e.g. a run's matmul peak from `bench.py`), the MFU of the timed steps
too: 6 × non-embedding parameters × target tokens/s / peak, as `bench.py` counts it.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import qkv_side
import torch
from phases import PartTimers, build, n_targets, params, train_batches
from workload import SHAPES

import qkv.model.dropout as qkv_dropout
import qkv.model.fused_ffn as qkv_fused_ffn
import qkv.model.linear as qkv_linear
import qkv.model.packed_attention as qkv_packed_attention
from qkv.training.speed import tune_allocator

STEP = "whole step"
MFU = "MFU, % of --peak"
SPLIT = ("forward + loss", "backward", "optimizer")
PRODUCTS = "linear layers' products (oneDNN)"
WEIGHT_PRODUCTS = "  of which the weights' gradients"
TRANSPOSES = "weight gradients' transposed copies"
ATTENTION = "attention, forward and backward"
GRID = "  of which rows into and out of the grid"
DROPOUT = "dropout, forward and backward"
FUSED_FFN = "feed-forward's fused ReLU-and-dropout passes, forward and backward"
LOSS = "loss, forward and backward"
PARTS = (PRODUCTS, WEIGHT_PRODUCTS, TRANSPOSES, ATTENTION, GRID, DROPOUT, FUSED_FFN, LOSS)
ONLY_WHERE_HASHED = (FUSED_FFN,)
"""Parts that a model too small for hashed dropout (`--shape tiny`) never runs."""


def timers() -> PartTimers:
    """Timers around the parts of a training step (`restore` takes them off)."""
    clock = PartTimers()
    clock.wrap(qkv_linear, "_product", PRODUCTS)
    clock.wrap(qkv_linear, "_weight_grad", TRANSPOSES)  # its products are taken out
    for name in ("forward", "backward"):
        clock.wrap(qkv_packed_attention._PackedAttention, name, ATTENTION)
    for name in ("_to_grid", "_from_grid"):
        clock.wrap(qkv_packed_attention, name, GRID)
    clock.wrap(qkv_dropout, "dropout", DROPOUT)
    clock.wrap(qkv_dropout._HashedDropout, "backward", DROPOUT)  # torch's words: autograd's
    clock.wrap(qkv_fused_ffn, "_dropout_pass", FUSED_FFN)  # its products: PRODUCTS
    clock.wrap(qkv_fused_ffn, "_gradient_pass", FUSED_FFN)
    return clock


def measure(args: argparse.Namespace) -> dict[str, float]:
    """Milliseconds per step of each part over `args.steps` steps after `args.warmup`."""
    tune_allocator()
    shape = SHAPES[args.shape]
    torch.manual_seed(args.seed)
    system = build("qkv", shape)
    batches = train_batches(args, shape)
    optimizer = system.optimizer(args.lr)
    system.model.train()
    loss_marks: dict[str, float] = {}
    original_loss = qkv_side.smoothed_cross_entropy

    def timed_loss(logits: torch.Tensor, *rest: Any, **kwargs: Any) -> torch.Tensor:
        start = time.perf_counter()
        loss = original_loss(logits, *rest, **kwargs)
        loss_marks["forward"] = time.perf_counter() - start
        logits.register_hook(lambda grad: loss_marks.__setitem__("made", time.perf_counter()))
        return loss

    qkv_side.smoothed_cross_entropy = timed_loss
    clock = timers()
    seconds = clock.seconds
    try:
        for i, batch in enumerate(batches[: args.warmup + args.steps]):
            if i == args.warmup:
                seconds.clear()
                clock.within.clear()
            marks = [time.perf_counter()]
            optimizer.zero_grad(set_to_none=True)
            loss = system.loss(batch["src"], batch["tgt_in"], batch["labels"])
            marks.append(time.perf_counter())
            loss.backward()
            marks.append(time.perf_counter())
            optimizer.step()
            marks.append(time.perf_counter())
            seconds[STEP] += marks[3] - marks[0]
            for part, start, end in zip(SPLIT, marks, marks[1:], strict=False):
                seconds[part] += end - start
            seconds[LOSS] += loss_marks["forward"] + loss_marks["made"] - marks[1]
    finally:
        clock.restore()
        qkv_side.smoothed_cross_entropy = original_loss
    seconds[WEIGHT_PRODUCTS] = clock.within[PRODUCTS, TRANSPOSES]
    seconds[TRANSPOSES] -= seconds[WEIGHT_PRODUCTS]
    timed = batches[args.warmup : args.warmup + args.steps]
    out = {part: 1000 * seconds[part] / len(timed) for part in (STEP, *SPLIT, *PARTS)}
    if args.peak:
        flops = 6 * params(system)["non_embedding"] * n_targets(timed)
        out[MFU] = 100 * flops / seconds[STEP] / (args.peak * 1e9)
    return out


def table(parts: dict[str, float]) -> list[str]:
    lines = ["| part | ms per step (MFU: %) |", "|---|---:|"]
    for part, ms in parts.items():
        label = f"&nbsp;&nbsp;↳ {part.strip()}" if part.startswith("  ") else part
        lines.append(f"| {'**' + label + '**' if part in (STEP, MFU) else label} | {ms:.1f} |")
    return lines


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="base")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-tokens", type=int, default=2000)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--peak", type=float, default=0.0, help="GFLOP/s, for the MFU")
    args = parser.parse_args(argv)
    args.device, args.dtype = "cpu", "fp32"
    torch.set_num_threads(args.threads)
    parts = measure(args)
    print("\n".join(table(parts)))
    return parts


if __name__ == "__main__":
    main()
