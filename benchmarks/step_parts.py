"""Where a qkv training step goes once the process is warm: wall-clock ms per step, by part.

The parts are timed with `time.perf_counter` around the functions that do them, on the
benchmark's identical batches, after warm-up steps that let the heap reach its size (no
profiler: it, and the first steps, whose new heap pages fault, inflate the big elementwise
operations two- to fivefold). The loss's backward is timed from the start of the backward to
the moment the logits' gradient is made.

    python benchmarks/step_parts.py [--threads 2] [--warmup 10] [--steps 20] [--peak 431.2]

With `--peak` (GFLOP/s, e.g. a run's matmul peak from `bench.py`), the MFU of the timed steps
too: 6 × non-embedding parameters × target tokens/s / peak, as `bench.py` counts it. The linear
layers' products are counted as well, 2 m n k FLOPs each, for their speed inside the steps; with
`--isolated`, each of them is timed again in a loop of its own, its operands in cache, for the
speed the same products reach there.

    python benchmarks/step_parts.py --peak 480 --isolated

With `--torch-softmax`, attention's softmax takes torch's kernels at every row length (the
compiled loops of `qkv.model.short_softmax` off: `train_ab.py`'s `softmax` change undone),
for its part to compare.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from contextlib import nullcontext
from typing import Any

import qkv_side
import torch
from phases import PartTimers, best_ms, build, n_targets, params, train_batches
from train_ab import undone
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
SOFTMAX = "  of which the softmax, forward and backward"
DROPOUT = "dropout, forward and backward"
FUSED_FFN = "feed-forward's fused ReLU-and-dropout passes, forward and backward"
LOSS = "loss, forward and backward"
PRODUCT_RATE = "  their GFLOP/s"
PARTS = (
    PRODUCTS,
    WEIGHT_PRODUCTS,
    TRANSPOSES,
    ATTENTION,
    GRID,
    SOFTMAX,
    DROPOUT,
    FUSED_FFN,
    LOSS,
)
ONLY_WHERE_HASHED = (FUSED_FFN,)
"""Parts that a model too small for hashed dropout (`--shape tiny`) never runs."""


def timers(log: ProductLog) -> PartTimers:
    """Timers around the parts of a training step (`restore` takes them off); the linear
    layers' products counted by `log`."""
    clock = PartTimers()
    clock.wrap(qkv_linear, "_product", PRODUCTS, see=log)
    clock.wrap(qkv_linear, "_weight_grad", TRANSPOSES)  # its products are taken out
    for name in ("forward", "backward"):
        clock.wrap(qkv_packed_attention._PackedAttention, name, ATTENTION)
    for name in ("_to_grid", "_from_grid"):
        clock.wrap(qkv_packed_attention, name, GRID)
    for name in ("softmax", "softmax_backward"):
        clock.wrap(qkv_packed_attention, name, SOFTMAX)
    clock.wrap(qkv_dropout, "dropout", DROPOUT)
    clock.wrap(qkv_dropout._HashedDropout, "backward", DROPOUT)  # torch's words: autograd's
    clock.wrap(qkv_fused_ffn, "_dropout_pass", FUSED_FFN)  # its products: PRODUCTS
    clock.wrap(qkv_fused_ffn, "_gradient_pass", FUSED_FFN)
    return clock


ISOLATED = "  the same products, each in a loop of its own: GFLOP/s"

Product = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], bool, str]
"""A product's operands as `isolated` makes them again: x's shape, the weight's shape and
strides, whether there is a bias, the activation."""


def product_flops(x_shape: tuple[int, ...], w_shape: tuple[int, ...], *rest: Any) -> float:
    """The FLOPs of `qkv.model.linear._product` by its operands' shapes (a `Product`'s first
    two): x (m, k) times a weight (n, k) transposed."""
    return 2.0 * x_shape[0] * x_shape[1] * w_shape[0]


class ProductLog:
    """Counts the products it is shown by their operands' shapes and layouts."""

    def __init__(self) -> None:
        self.counts: Counter[Product] = Counter()

    def __call__(
        self, x: torch.Tensor, weight: torch.Tensor, bias: Any = None, activation: str = "none"
    ) -> None:
        key = (tuple(x.shape), tuple(weight.shape), weight.stride(), bias is not None)
        self.counts[(*key, activation)] += 1

    def flops(self) -> float:
        """The FLOPs of every product counted."""
        return sum(count * product_flops(*product) for product, count in self.counts.items())


def isolated(log: ProductLog) -> float:
    """GFLOP/s of the logged products, each shape timed in a loop of its own (best of 7
    passes of 20 calls, operands in cache) and weighted by how often the steps made it."""
    seconds = 0.0
    for (x_shape, w_shape, w_stride, has_bias, activation), count in log.counts.items():
        x = torch.randn(x_shape)
        transposed = w_stride[0] < w_stride[1]  # a transposed view, as the gradients pass it
        weight = torch.randn(w_shape[::-1]).t() if transposed else torch.randn(w_shape)
        bias = torch.randn(w_shape[0]) if has_bias else None
        ms = best_ms(lambda: qkv_linear._product(x, weight, bias, activation))  # noqa: B023
        seconds += count * ms / 1000
    return log.flops() / seconds / 1e9


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
    log = ProductLog()
    clock = timers(log)
    seconds = clock.seconds
    try:
        for i, batch in enumerate(batches[: args.warmup + args.steps]):
            if i == args.warmup:
                seconds.clear()
                clock.within.clear()
                log.counts.clear()
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
    out = {}
    for part in (STEP, *SPLIT, *PARTS):
        out[part] = 1000 * seconds[part] / len(timed)
        if part == PRODUCTS:  # and their speed, in the line below them
            out[PRODUCT_RATE] = log.flops() / seconds[PRODUCTS] / 1e9
            if args.isolated:
                out[ISOLATED] = isolated(log)
    if args.peak:
        flops = 6 * params(system)["non_embedding"] * n_targets(timed)
        out[MFU] = 100 * flops / seconds[STEP] / (args.peak * 1e9)
    return out


def table(parts: dict[str, float]) -> list[str]:
    lines = ["| part | ms per step (MFU: %; products: GFLOP/s) |", "|---|---:|"]
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
    parser.add_argument(
        "--isolated",
        action="store_true",
        help="also time each product of the steps in a loop of its own (about a minute)",
    )
    parser.add_argument(
        "--torch-softmax",
        action="store_true",
        help="attention's softmax by torch's kernels at every row length",
    )
    args = parser.parse_args(argv)
    args.device, args.dtype = "cpu", "fp32"
    torch.set_num_threads(args.threads)
    with undone("softmax") if args.torch_softmax else nullcontext():
        parts = measure(args)
    print("\n".join(table(parts)))
    return parts


if __name__ == "__main__":
    main()
