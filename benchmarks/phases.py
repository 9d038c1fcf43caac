"""The measurements. Each runs in a fresh worker process (see `bench.py`) and returns a dict.

peak    matmul GFLOP/s, the denominator of MFU
train   target tokens/s on the identical batches; a qkv tree also on its own length-bucketed
        batches (its `bucketed_batches`)
decode  greedy and beam sentences/s, batches of `--infer-batch`, exactly `--new-tokens` tokens:
        each kind of search in every way of `decoding_ways`, the passes taking turns
pair    qkv and one peer in one process, their training steps or decoding passes interleaved

Every phase runs on `args.device` (cpu or cuda) in `args.dtype`: fp32, or bf16, the peak in the
same. In bf16, training runs under `torch.autocast` (weights and optimizer state stay fp32) and
decoding casts every system's weights to bf16 (`for_decoding`), as bf16 models are decoded:
Hugging Face's `torch_dtype=torch.bfloat16`, qkv's `translate --bf16`.

A system is a peer (`peers.py`) or qkv, built by a source tree's own `benchmarks/qkv_side.py`
(`load_qkv_side`) with that tree's own `qkv` package. Nothing here imports qkv: the qkv side
is the one place that knows its internals (and the CTranslate2 peers, exported from this
tree's qkv model). A system that decodes outside torch (CTranslate2) still has a torch `model`
to move and put in eval mode, and names its own weights (`weights_dtype`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any, TypeVar

import numpy as np
import torch
from workload import (
    PAD,
    SHAPES,
    Shape,
    digest,
    make_sources,
    make_train_batches,
    pad_batch,
    padding,
)

Batch = dict[str, torch.Tensor]
Result = TypeVar("Result")


def device_of(args: Any) -> torch.device:
    return torch.device(getattr(args, "device", "cpu"))


def matmul_dtype(args: Any) -> torch.dtype:
    return torch.bfloat16 if getattr(args, "dtype", "fp32") == "bf16" else torch.float32


def autocast(args: Any) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on the phase's device, or nothing for fp32."""
    if matmul_dtype(args) == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_of(args).type, dtype=torch.bfloat16)


def for_decoding(system: Any, args: Any) -> None:
    """Eval mode, and under `--dtype bf16` the weights cast to bf16, unless the system decodes
    under autocast (`bf16_weights` False: x-transformers makes float32 activations of its own)."""
    system.model.eval()
    if matmul_dtype(args) == torch.bfloat16 and getattr(system, "bf16_weights", True):
        system.model.to(torch.bfloat16)


def decoding_autocast(system: Any, args: Any) -> contextlib.AbstractContextManager[Any]:
    """Autocast for a bf16 run of a system whose weights stay float32, else nothing."""
    if getattr(system, "bf16_weights", True):
        return contextlib.nullcontext()
    return autocast(args)


def sync(args: Any) -> None:
    """Wait for the device to finish what was queued (a no-op on the CPU)."""
    if device_of(args).type == "cuda":
        torch.cuda.synchronize()


def load_qkv_side(tree: str) -> ModuleType:
    """`<tree>/benchmarks/qkv_side.py`, imported as the module `qkv_side`.

    It drives the `qkv` package that this process imports, which must be the tree's own
    (`<tree>/src/qkv`; the driver puts `<tree>/src` first on a worker's PYTHONPATH).

    Raises:
        RuntimeError: if `qkv` comes from somewhere else, or the tree has no qkv side.
    """
    path = os.path.realpath(os.path.join(tree, "benchmarks", "qkv_side.py"))
    loaded = sys.modules.get("qkv_side")
    if loaded is not None and os.path.realpath(getattr(loaded, "__file__", "")) == path:
        return loaded
    import qkv

    found = os.path.realpath(os.path.dirname(qkv.__file__))
    expected = os.path.realpath(os.path.join(tree, "src", "qkv"))
    if found != expected:
        raise RuntimeError(f"this process imports qkv from {found}, not from {expected}")
    spec = importlib.util.spec_from_file_location("qkv_side", path)
    if spec is None or spec.loader is None or not os.path.exists(path):
        raise RuntimeError(f"no qkv side at {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["qkv_side"] = module
    spec.loader.exec_module(module)
    return module


def qkv_side_of(name: str, args: Any) -> ModuleType | None:
    """The qkv side that builds system `name`, or None for a peer."""
    tree = (getattr(args, "qkv_trees", None) or {}).get(name)
    return None if tree is None else load_qkv_side(tree)


def build(name: str, shape: Shape, args: Any) -> Any:
    """qkv (any of `args.qkv_trees`) or a peer, with the same interface, on the phase's device."""
    side = qkv_side_of(name, args)
    if side is not None:
        system: Any = side.QkvSystem(shape, not getattr(args, "no_cuda_graphs", False))
    else:
        from peers import build_peer

        system = build_peer(name, shape, device_of(args).type, split_of(args))
    system.model.to(device_of(args))
    return system


def origin(name: str, args: Any) -> dict[str, str]:
    """Where a qkv system's package came from (nothing for a peer)."""
    if qkv_side_of(name, args) is None:
        return {}
    import qkv

    return {"qkv_package": os.path.dirname(os.path.realpath(qkv.__file__))}


def memory(args: Any) -> dict[str, float]:
    """Peak host RSS, and on a GPU the peak of memory allocated by torch, in MB."""
    out = {"peak_rss_mb": peak_rss_mb()}
    if device_of(args).type == "cuda":
        out["peak_device_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def first_probe(args: Any) -> float:
    """The probe at a phase's start, before the system is built. On a GPU the cuBLAS workspace
    that its matmul gave the default stream (32 MB on an H100) is freed again, so that each
    system's memory counts the workspaces of the streams that system uses, and no more."""
    gflops = probe_gflops(args.probe_size, args)
    if device_of(args).type == "cuda":
        torch.cuda.synchronize()
        torch._C._cuda_clearCublasWorkspaces()
    return gflops


def later_probe(probes: list[float], args: Any) -> None:
    """A probe after the system was built, appended to `probes`: on a CPU only. On a GPU, where
    a probe shows nothing of the host's cores, it would give the default stream a cuBLAS
    workspace that a system decoding on another stream never makes."""
    if device_of(args).type != "cuda":
        probes.append(probe_gflops(args.probe_size, args))


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def probe_gflops(n: int, args: Any = None) -> float:
    """Best of 5 n^3 matmuls (n = 1024 by default): shows when a core was taken."""
    return best_gflops(n, n, n, 5, args)


def best_gflops(m: int, k: int, n: int, repeats: int, args: Any = None) -> float:
    """GFLOP/s of the best of `repeats` (m, k) x (k, n) matmuls on the phase's device and dtype."""
    options = {"device": device_of(args), "dtype": matmul_dtype(args)}
    a, b, c = (
        torch.randn(m, k, **options),
        torch.randn(k, n, **options),
        torch.empty(m, n, **options),
    )
    return 2 * m * k * n / _best_seconds(lambda: torch.mm(a, b, out=c), repeats, args) / 1e9


def onednn_applies(args: Any) -> bool:
    """Whether oneDNN's matmul is measured beside torch.mm: a CPU, and fp32 or native bf16."""
    if device_of(args).type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    native_bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return matmul_dtype(args) == torch.float32 or native_bf16


def best_onednn_gflops(m: int, k: int, n: int, repeats: int, args: Any = None) -> float:
    """GFLOP/s of the best of `repeats` (m, k) x (k, n) products by oneDNN's matmul on the CPU,
    the (k, n) operand reordered once into its blocked layout."""
    dtype = matmul_dtype(args)
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
    blocked = torch.ops.mkldnn._reorder_linear_weight(b, m)

    def product() -> object:
        return torch.ops.mkldnn._linear_pointwise(a, blocked, None, "none", [], "")

    return 2 * m * k * n / _best_seconds(product, repeats, args) / 1e9


def _best_seconds(fn: Callable[[], object], repeats: int, args: Any) -> float:
    """The fastest of `repeats` calls of `fn`, after one untimed call, waiting for the device."""
    fn()
    sync(args)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync(args)
        best = min(best, time.perf_counter() - start)
    return best


def params(system: Any) -> dict[str, int]:
    trainable = sum(p.numel() for p in system.model.parameters() if p.requires_grad)
    embedding = system.n_embedding_params()
    return {
        "trainable": trainable,
        "embedding_tables": embedding,
        "non_embedding": trainable - embedding,
    }


def to_tensors(batches: list[dict[str, np.ndarray]], args: Any) -> list[Batch]:
    device = device_of(args)
    return [{k: torch.from_numpy(v).to(device) for k, v in b.items()} for b in batches]


def train_arrays(args: Any, shape: Shape) -> list[dict[str, np.ndarray]]:
    """The identical training batches: `--warmup` untimed, then `--steps` timed."""
    return make_train_batches(args.warmup + args.steps, args.batch_tokens, args.seed + 1, shape)


def n_targets(batches: list[Batch]) -> int:
    return sum(int((b["labels"] != PAD).sum()) for b in batches)


def optimizer_kind(optimizer: torch.optim.Optimizer) -> str:
    """How an optimizer steps: "fused", "foreach" or "for-loop"."""
    group = optimizer.param_groups[0]
    if group.get("fused"):
        return "fused"
    return "foreach" if group.get("foreach") else "for-loop"


def step_function(system: Any, lr: float, args: Any = None) -> tuple[Callable[[Batch], float], str]:
    """One optimiser step on a batch, returning the loss (reading it waits for the device),
    and how its optimizer steps.

    On a GPU, a system's own step recorded as CUDA graphs (qkv's trainer's) where it has one.
    """
    graphed = getattr(system, "graphed_step_function", None)
    if graphed is not None and device_of(args).type == "cuda":
        dtype = matmul_dtype(args)
        found = graphed(lr, dtype if dtype != torch.float32 else None)
        if found is not None:
            return found, "the system's own step, one CUDA graph replay"
    optimizer = system.optimizer(lr)
    system.model.train()

    def step(batch: Batch) -> float:
        optimizer.zero_grad(set_to_none=True)
        with autocast(args):
            loss = system.loss(batch["src"], batch["tgt_in"], batch["labels"])
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    return step, f"{type(optimizer).__name__}, {optimizer_kind(optimizer)}"


def timed_rounds(
    step: Callable[[Batch], float],
    warm: list[Batch],
    timed: list[Batch],
    repeats: int,
    untimed_first: bool = False,
) -> dict[str, Any]:
    """Warm up (also over `timed` when `untimed_first`), then time `repeats` passes over
    `timed`; tokens/s of the median pass."""
    losses = [step(b) for b in warm + (timed if untimed_first else [])]
    tokens = n_targets(timed)
    rounds = []
    for _ in range(repeats):
        start = time.perf_counter()
        losses += [step(b) for b in timed]
        seconds = time.perf_counter() - start
        rounds.append(
            {
                "seconds": seconds,
                "tgt_tokens_per_s": tokens / seconds,
                "step_ms": 1000 * seconds / len(timed),
            }
        )
    median = sorted(rounds, key=lambda r: r["seconds"])[len(rounds) // 2]
    return {
        "tgt_tokens_per_s": median["tgt_tokens_per_s"],
        "step_ms": median["step_ms"],
        "repeats": rounds,
        "tgt_tokens": tokens,
        "batches": len(timed),
        "loss_first_last": [losses[0], losses[-1]],
        "loss_finite": all(math.isfinite(x) for x in losses),
    }


def phase_peak(args: Any) -> dict[str, Any]:
    sizes = (
        [(2048, 2048, 2048, 10), (4096, 4096, 4096, 4)]
        if args.shape == "base"
        else [(256, 256, 256, 3)]
    )
    if device_of(args).type == "cuda" and args.shape == "base":
        sizes.append((8192, 8192, 8192, 4))
    shapes = {f"{m}x{k}x{n}": best_gflops(m, k, n, reps, args) for m, k, n, reps in sizes}
    # torch.mm goes to the BLAS (MKL), which takes narrower vector units on some CPUs (AMD's)
    # than oneDNN's matmul, also in torch: the peak is the best of both, so that no MFU is
    # taken against less than the hardware gives.
    onednn = (
        {f"{m}x{k}x{n}": best_onednn_gflops(m, k, n, reps, args) for m, k, n, reps in sizes}
        if onednn_applies(args)
        else {}
    )
    return {
        "gflops": shapes,
        "onednn_gflops": onednn,
        "torch_mm_peak_gflops": max(shapes.values()),
        "peak_gflops": max(*shapes.values(), *onednn.values()),
        "probe_gflops": [probe_gflops(args.probe_size, args)],
        "device": str(device_of(args)),
        "dtype": str(matmul_dtype(args)),
    }


def phase_train(args: Any) -> dict[str, Any]:
    shape = SHAPES[args.shape]
    torch.manual_seed(args.seed)
    probes = [first_probe(args)]
    system = build(args.system, shape, args)
    arrays = train_arrays(args, shape)
    batches = to_tensors(arrays, args)
    step, optimizer = step_function(system, args.lr, args)
    result = {
        "system": args.system,
        "meta": system.meta,
        "params": params(system),
        "optimizer": optimizer,
        **origin(args.system, args),
        "batches": {
            **padding(arrays[args.warmup :]),
            "digest": digest(arrays),
            "sentences": [len(b["src"]) for b in arrays[args.warmup :]],
        },
    }
    result["identical"] = timed_rounds(
        step, batches[: args.warmup], batches[args.warmup :], args.repeats, untimed_pass_first(args)
    )
    later_probe(probes, args)
    side = qkv_side_of(args.system, args)
    if side is not None and hasattr(side, "bucketed_batches"):
        regrouped = [
            {"src": b.src.numpy(), "tgt_in": b.tgt_in.numpy(), "labels": b.labels.numpy()}
            for b in side.bucketed_batches(arrays, args.seed)
        ]
        bucketed = to_tensors(regrouped, args)
        result["bucketed"] = timed_rounds(
            step,
            bucketed[: args.warmup],
            bucketed[args.warmup :],
            args.repeats,
            untimed_pass_first(args),
        )
        result["bucketed"]["padding"] = padding(regrouped[args.warmup :])
        later_probe(probes, args)
    result.update(**memory(args), probe_gflops=probes, threads=torch.get_num_threads())
    return result


def decode_batches(args: Any, shape: Shape) -> list[torch.Tensor]:
    sources = make_sources(args.sentences, args.seed + 2, shape)
    return [
        torch.from_numpy(pad_batch(sources[i : i + args.infer_batch])).to(device_of(args))
        for i in range(0, len(sources), args.infer_batch)
    ]


def untimed_pass_first(args: Any) -> bool:
    """Whether every timed batch runs once, untimed, before the timing.

    On a GPU the first step of each new shape costs about 0.4 s (kernel choice and loading), once
    per process: a long run pays it once, a 20-step benchmark would pay it on every step.
    """
    return device_of(args).type == "cuda"


def split_of(args: Any) -> int:
    """How many greedy batches every system decodes at once in the like-for-like figure
    (`--split`): on a CPU only, and at most one per torch thread."""
    if device_of(args).type != "cpu":
        return 1
    return max(1, min(getattr(args, "split", 1), args.threads))


def map_split(job: Callable[[int], Result], count: int, workers: int) -> Iterator[Result]:
    """`job(0), ..., job(count - 1)`, yielded in order, `workers` at a time.

    Each of `workers` threads of this process runs torch on its share of the caller's torch
    threads (one each when they are as many) and takes the next index when it is free; the
    last `count % workers` jobs, which would leave threads idle, run here afterwards on all of
    the caller's threads. This is how `qkv translate` decodes greedy batches on a CPU
    (`--workers`), here given to every system alike. With one worker, everything runs here.
    """
    workers = min(workers, count)
    if workers <= 1:
        yield from map(job, range(count))
        return
    threads = torch.get_num_threads()
    split = count - count % workers
    pool = ThreadPoolExecutor(
        workers, initializer=torch.set_num_threads, initargs=(max(1, threads // workers),)
    )
    try:
        futures = [pool.submit(job, i) for i in range(split)]
        for future in futures:
            yield future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        torch.set_num_threads(threads)  # torch keeps the last count set as its default
    yield from map(job, range(split, count))


SHIPPED = "shipped"
"""The way of decoding of a system's own batching (a qkv side's `map_batches`)."""


def decoding_ways(system: Any, args: Any, width: int) -> dict[str, int | str]:
    """How a pass may go over the batches (beam `width`, 1 for greedy): name -> workers.

    "split": greedy, `split_of(args)` batches at once, for every system alike (CPU only);
    "one": one batch at a time on all the torch threads, as every peer ships;
    "shipped": as the system batches by itself (`map_batches`), where it has a way of its own.
    """
    ways: dict[str, int | str] = {}
    if width == 1 and split_of(args) > 1:
        ways["split"] = split_of(args)
    ways["one"] = 1
    if hasattr(system, "map_batches"):
        ways[SHIPPED] = SHIPPED
    return ways


def headline_way(ways: dict[str, Any]) -> str:
    """The like-for-like way: the same batches in flight for every system."""
    return "split" if "split" in ways else "one"


def decode_pass(
    system: Any,
    run: Callable[[Any, torch.Tensor], torch.Tensor],
    batches: list[torch.Tensor],
    workers: int | str,
    args: Any,
    width: int = 1,
) -> float:
    """Seconds to decode every batch, `workers` at once (`map_split`), or as the system does
    many (`SHIPPED`); checks each output's shape."""

    def job(index: int) -> torch.Tensor:
        with torch.inference_mode(), decoding_autocast(system, args):
            return run(system, batches[index])

    def one(batch: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(), decoding_autocast(system, args):
            return run(system, batch)

    start = time.perf_counter()
    if workers == SHIPPED:
        found = list(system.map_batches(one, batches, width))
    else:
        found = list(map_split(job, len(batches), int(workers)))
    sync(args)
    seconds = time.perf_counter() - start
    for batch, out in zip(batches, found, strict=True):
        assert out.shape == (batch.size(0), args.new_tokens), (tuple(out.shape), args.new_tokens)
    return seconds


def decoding_kinds(
    args: Any, systems: list[Any]
) -> dict[str, tuple[int, Callable[[Any, torch.Tensor], torch.Tensor]]]:
    """Greedy, and beam search when `--beam` and every system has one: kind -> (width, run),
    run(system, batch) -> (B, --new-tokens) ids."""
    kinds: dict[str, tuple[int, Callable[[Any, torch.Tensor], torch.Tensor]]] = {
        "greedy": (1, lambda s, b: s.greedy(b, args.new_tokens))
    }
    if args.beam and all(hasattr(s, "beam") for s in systems):
        kinds["beam"] = (args.beam, lambda s, b: s.beam(b, args.new_tokens, args.beam))
    return kinds


def phase_decode(args: Any) -> dict[str, Any]:
    """Each kind of search in each of `decoding_ways`, a pass a way in turn (forward, then
    backward), `--decode-repeats` passes of greedy and half as many of beam search."""
    shape = SHAPES[args.shape]
    torch.manual_seed(args.seed)
    probes = [first_probe(args)]
    system = build(args.system, shape, args)
    for_decoding(system, args)
    batches = decode_batches(args, shape)
    sentences = sum(b.size(0) for b in batches)
    # a system that decodes outside torch (CTranslate2) names its own weights
    weights = getattr(system, "weights_dtype", None) or str(next(system.model.parameters()).dtype)
    result: dict[str, Any] = {
        "system": args.system,
        "meta": system.meta,
        "weights": weights,
        **origin(args.system, args),
    }
    with torch.inference_mode():
        for kind, (width, run) in decoding_kinds(args, [system]).items():
            with decoding_autocast(system, args):
                run(system, batches[0][:2])  # warm-up; its decoding weights serve the workers
            ways = decoding_ways(system, args, width)
            passes = args.decode_repeats if kind == "greedy" else max(1, args.decode_repeats // 2)
            skip = int(untimed_pass_first(args))
            seconds: dict[str, list[float]] = {way: [] for way in ways}
            names = list(ways)
            for index in range(skip + passes):
                for way in names if index % 2 == 0 else names[::-1]:
                    took = decode_pass(system, run, batches, ways[way], args, width)
                    if index >= skip:
                        seconds[way].append(took)
            result[kind] = speeds(ways, seconds, sentences, args)
            if kind == "beam":
                result[kind]["k"] = args.beam
            else:
                result.update({f"{k}_greedy": v for k, v in memory(args).items()})
            later_probe(probes, args)
    result.update(
        sentences=sentences,
        batch=args.infer_batch,
        new_tokens=args.new_tokens,
        **memory(args),
        probe_gflops=probes,
    )
    return result


def speeds(
    ways: dict[str, int | str], seconds: dict[str, list[float]], sentences: int, args: Any
) -> dict[str, Any]:
    """Sentences/s of each way (median pass), and the like-for-like way's as the kind's own."""
    threads = args.threads
    out: dict[str, Any] = {"ways": {}}
    for way, workers in ways.items():
        out["ways"][way] = {
            "seconds": seconds[way],
            "sentences_per_s": sentences / statistics.median(seconds[way]),
        }
        if workers != SHIPPED:
            out["ways"][way].update(
                workers=int(workers), threads_each=max(1, threads // int(workers))
            )
    out["headline"] = headline_way(ways)
    out["sentences_per_s"] = out["ways"][out["headline"]]["sentences_per_s"]
    return out


def phase_pair(args: Any) -> dict[str, Any]:
    """qkv (A) and a peer (B) trained (`pair_part` "train") or decoding ("decode") in one
    process, their steps or passes interleaved AB BA AB ..., so that load from other processes
    hits both alike. Ratios are A's speed over B's."""
    shape = SHAPES[args.shape]
    torch.manual_seed(args.seed)
    names = ["qkv", args.peer]
    probes = [probe_gflops(args.probe_size, args)]
    systems = [build(n, shape, args) for n in names]
    result: dict[str, Any] = {"a": names[0], "b": names[1], "pair_part": args.pair_part}
    if args.pair_part == "train":
        result["train"] = _pair_train(args, shape, systems)
    else:
        result["decode"] = _pair_decode(args, shape, dict(zip(names, systems, strict=True)))
    result["probe_gflops"] = [*probes, probe_gflops(args.probe_size, args)]
    return result


def _pair_train(args: Any, shape: Shape, systems: list[Any]) -> dict[str, Any]:
    batches = to_tensors(train_arrays(args, shape), args)
    steps = [step_function(s, args.lr, args)[0] for s in systems]
    warm = batches if untimed_pass_first(args) else batches[: args.warmup]
    for batch in warm:
        for step in steps:
            step(batch)
    seconds: list[list[float]] = [[], []]
    for index, batch in enumerate(batches[args.warmup :]):
        for side in (0, 1) if index % 2 == 0 else (1, 0):
            start = time.perf_counter()
            steps[side](batch)
            seconds[side].append(time.perf_counter() - start)
    tokens = n_targets(batches[args.warmup :])
    return {
        "a_tokens_per_s": tokens / sum(seconds[0]),
        "b_tokens_per_s": tokens / sum(seconds[1]),
        "ratio": sum(seconds[1]) / sum(seconds[0]),
        "ratio_median_pair": statistics.median(b / a for a, b in zip(*seconds, strict=True)),
    }


def _pair_decode(args: Any, shape: Shape, systems: dict[str, Any]) -> dict[str, Any]:
    """Both systems, greedy in the like-for-like split and one batch at a time, beam search
    one batch at a time: every (system, way) a pass in turn, forward then backward."""
    batches = decode_batches(args, shape)
    sentences = sum(b.size(0) for b in batches)
    out: dict[str, Any] = {"sentences": sentences, "split": split_of(args)}
    for system in systems.values():
        for_decoding(system, args)
    with torch.inference_mode():
        for kind, (width, run) in decoding_kinds(args, list(systems.values())).items():
            workers = sorted({split_of(args) if width == 1 else 1, 1}, reverse=True)
            ways = [(name, w) for name in systems for w in workers]
            for system in systems.values():
                with decoding_autocast(system, args):
                    run(system, batches[0][:2])  # warm-up
            seconds: dict[tuple[str, int], list[float]] = {way: [] for way in ways}
            skip = int(untimed_pass_first(args))
            for index in range(skip + args.decode_repeats):
                for name, w in ways if index % 2 == 0 else ways[::-1]:
                    took = decode_pass(systems[name], run, batches, w, args, width)
                    if index >= skip:
                        seconds[name, w].append(took)
            out[kind] = [
                {
                    "system": name,
                    "workers": w,
                    "threads_each": max(1, args.threads // w),
                    "sentences_per_s": sentences / statistics.median(seconds[name, w]),
                    "seconds": seconds[name, w],
                }
                for name, w in ways
            ]
    return out
