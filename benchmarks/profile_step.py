"""Where a training step goes: wall-clock split (forward + loss, backward, optimizer) over a few
steps, and torch.profiler self-CPU time of one step by op category; then where a decoding step
goes (`profile_decode.py`)."""

from __future__ import annotations

import time
from typing import Any

import torch
from phases import build, params, train_batches
from profile_decode import decode_split
from torch.profiler import ProfilerActivity, profile
from workload import SHAPES

COMPILED = "compiled loop (inductor)"
CATEGORIES = [
    (
        "gemm (mm/addmm/bmm, oneDNN linear)",
        ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "mkldnn::_linear_pointwise"),
    ),
    ("attention kernels (SDPA)", ("scaled_dot_product", "flash_attention")),
    (
        "dropout masks (RNG)",
        (
            "aten::bernoulli",
            "aten::native_dropout",
            "aten::random_",
            "aten::uniform_",
            "aten::ge",
            "aten::lt",
        ),
    ),
    (
        "softmax / log_softmax / nll",
        (
            "aten::_softmax",
            "aten::_log_softmax",
            "aten::nll_loss",
            "aten::_softmax_backward_data",
            "aten::_log_softmax_backward_data",
        ),
    ),
    ("layer_norm", ("aten::native_layer_norm",)),
    (
        "gather / scatter / copy / embedding",
        (
            "aten::copy_",
            "aten::cat",
            "aten::clone",
            "aten::embedding",
            "aten::index",
            "aten::index_select",
            "aten::index_add_",
            "aten::index_copy",
            "aten::index_put_",
            "aten::embedding_dense_backward",
            "aten::masked_select",
            "aten::nonzero",
        ),
    ),
    ("optimizer (fused AdamW, foreach norms)", ("aten::_foreach", "aten::_fused_adam")),
    ("compiled loops (hashed dropout, loss)", (COMPILED,)),
]
OTHER = "other (elementwise, reductions, fills)"


def category(op: str) -> str:
    for name, prefixes in CATEGORIES:
        if any(op.startswith(p) or (not p.startswith("aten::") and p in op) for p in prefixes):
            return name
    return OTHER


def phase_profile(args: Any) -> dict[str, Any]:
    shape = SHAPES[args.shape]
    torch.manual_seed(args.seed)
    system = build(args.system, shape)
    batches = train_batches(args, shape)
    optimizer = system.optimizer(args.lr)
    system.model.train()
    split = {"forward_loss": 0.0, "backward": 0.0, "optimizer": 0.0}

    def step(batch: dict[str, torch.Tensor], record: bool) -> None:
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = system.loss(batch["src"], batch["tgt_in"], batch["labels"])
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        t3 = time.perf_counter()
        if record:
            for key, seconds in zip(split, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                split[key] += seconds

    for batch in batches[: args.warmup]:
        step(batch, record=False)
    measured = batches[args.warmup :][: max(1, min(8, args.steps - 1))]
    for batch in measured:
        step(batch, record=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(batches[-1], record=False)
    by_category: dict[str, float] = {}
    by_op: dict[str, dict[str, Any]] = {}
    for event in prof.key_averages():
        ms = event.self_cpu_time_total / 1000.0
        if ms > 0:
            # "## Call CompiledFxGraph <hash> ##": one inductor graph, named by its hash
            op = COMPILED if "CompiledFxGraph" in event.key else event.key
            by_category[category(op)] = by_category.get(category(op), 0.0) + ms
            entry = by_op.setdefault(op, {"op": op, "self_ms": 0.0, "calls": 0})
            entry["self_ms"] += ms
            entry["calls"] += event.count
    total = sum(by_category.values()) or 1.0
    ops = sorted(by_op.values(), key=lambda o: -o["self_ms"])
    return {
        "system": args.system,
        "params": params(system),
        "steps": len(measured),
        "split_ms": {k: 1000 * v / len(measured) for k, v in split.items()},
        "category_pct": {
            k: 100 * v / total for k, v in sorted(by_category.items(), key=lambda kv: -kv[1])
        },
        "profiled_ms": total,
        "top_ops": ops[:12],
        "decode_split": decode_split(args),
    }
