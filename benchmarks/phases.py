"""The measurements. Each runs in a fresh worker process (see `bench.py`) and returns a dict.

Every phase runs on `args.device` (cpu or cuda) in `args.dtype`: fp32, or bf16, the peak in the
same. In bf16, training runs under `torch.autocast` (weights and optimizer state stay fp32) and
decoding casts every system's weights to bf16 (`for_decoding`), as bf16 models are decoded:
Hugging Face's `torch_dtype=torch.bfloat16`, qkv's `translate --bf16`.

peak      fp32 matmul GFLOP/s, the denominator of MFU
train     target tokens/s on the identical batches (qkv: also on its bucketed batches)
decode    greedy and beam sentences/s, batch 64, exactly n new tokens
profile   where one qkv training step goes (torch.profiler, by op category)
pair      qkv and one peer in one process, their steps interleaved AB BA AB ...
"""

from __future__ import annotations

import argparse
import contextlib
import math
import resource
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from workload import PAD, SHAPES, Shape, make_sources, make_train_batches, pad_batch

from qkv.model.frozen_linear import cpu_bf16_matmuls

Batch = dict[str, torch.Tensor]


def ab_decoding_parser(description: str) -> argparse.ArgumentParser:
    """The options of the interleaved decoding A/B scripts: threads, the benchmark's decoding
    workload, and how many passes each way takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--infer-batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=50)
    parser.add_argument("--passes", type=int, default=3)
    return parser


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


def build(name: str, shape: Shape, args: Any = None) -> Any:
    """qkv or a peer, with the same interface, on the phase's device."""
    if name == "qkv":
        from qkv_side import QkvSystem

        system: Any = QkvSystem(shape, not getattr(args, "no_cuda_graphs", False))
    else:
        from peers import build_peer

        system = build_peer(name, shape)
    system.model.to(device_of(args))
    return system


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
    dtype = matmul_dtype(args)
    return (
        device_of(args).type == "cpu"
        and torch.backends.mkldnn.is_available()
        and (dtype == torch.float32 or (dtype == torch.bfloat16 and cpu_bf16_matmuls()))
    )


def best_onednn_gflops(m: int, k: int, n: int, repeats: int, args: Any = None) -> float:
    """GFLOP/s of the best of `repeats` (m, k) x (k, n) products by oneDNN's matmul on the CPU,
    the (k, n) operand reordered once into its blocked layout (as `FrozenLinear` does)."""
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


class PartTimers:
    """Wall-clock timers put around functions (`wrap`) and taken off again (`restore`).

    `seconds[part]`: the time spent in the functions wrapped as `part`, summed; the parts are
    listed in the order of their first `wrap`. `within[part, outer]`: the share of it spent
    while a function wrapped as `outer` was running (a product inside a weight's gradient).
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.within: dict[tuple[str, str], float] = defaultdict(float)
        self._running: list[str] = []
        self._undo: list[tuple[Any, str, Any]] = []

    def wrap(
        self, owner: Any, name: str, part: str, see: Callable[..., object] | None = None
    ) -> None:
        """Time `owner.name` (a module's function, a class's method, an object's) as `part`;
        `see(*args, **kwargs)`, if given, is shown each call's arguments first."""
        original = vars(owner).get(name, getattr(owner, name))  # a staticmethod as it is

        def timed(*args: Any, **kwargs: Any) -> Any:
            if see is not None:
                see(*args, **kwargs)
            start = time.perf_counter()
            self._running.append(part)
            try:
                return original(*args, **kwargs)
            finally:
                self._running.pop()
                spent = time.perf_counter() - start
                self.seconds[part] += spent
                for outer in set(self._running):
                    self.within[part, outer] += spent

        self._undo.append((owner, name, original))
        setattr(owner, name, timed)
        self.seconds[part] += 0.0  # listed in the order of wrapping

    def restore(self) -> None:
        """Put every wrapped function back."""
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()


def best_ms(fn: Callable[[], object], passes: int = 7, calls: int = 20, warmups: int = 3) -> float:
    """Best milliseconds per call over `passes` passes of `calls` calls, after `warmups` calls."""
    for _ in range(warmups):
        fn()
    best = math.inf
    for _ in range(passes):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return 1000 * best


def params(system: Any) -> dict[str, int]:
    trainable = sum(p.numel() for p in system.model.parameters() if p.requires_grad)
    embedding = system.n_embedding_params()
    return {
        "trainable": trainable,
        "embedding_tables": embedding,
        "non_embedding": trainable - embedding,
    }


def train_batches(args: Any, shape: Shape) -> list[Batch]:
    batches = make_train_batches(args.warmup + args.steps, args.batch_tokens, args.seed + 1, shape)
    device = device_of(args)
    return [{k: torch.from_numpy(v).to(device) for k, v in b.items()} for b in batches]


def n_targets(batches: list[Batch]) -> int:
    return sum(int((b["labels"] != PAD).sum()) for b in batches)


def step_function(system: Any, lr: float, args: Any = None) -> Callable[[Batch], float]:
    """One optimiser step on a batch; returns the loss (reading it waits for the device).

    On a GPU, a system's own step recorded as CUDA graphs (qkv's trainer's) where it has one.
    """
    graphed = getattr(system, "graphed_step_function", None)
    if graphed is not None and device_of(args).type == "cuda":
        dtype = matmul_dtype(args)
        found = graphed(lr, dtype if dtype != torch.float32 else None)
        if found is not None:
            return found  # type: ignore[no-any-return]
    optimizer = system.optimizer(lr)
    system.model.train()

    def step(batch: Batch) -> float:
        optimizer.zero_grad(set_to_none=True)
        with autocast(args):
            loss = system.loss(batch["src"], batch["tgt_in"], batch["labels"])
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    return step


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
        "padded_tgt_tokens": sum(b["labels"].numel() for b in timed),
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
    # than oneDNN's matmul, also in torch and what qkv's linear layers use: the peak is the
    # best of both, so that no MFU is taken against less than the hardware gives.
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
    batches = train_batches(args, shape)
    step = step_function(system, args.lr, args)
    result = {"system": args.system, "meta": system.meta, "params": params(system)}
    result["identical"] = timed_rounds(
        step, batches[: args.warmup], batches[args.warmup :], args.repeats, untimed_pass_first(args)
    )
    later_probe(probes, args)
    if args.system == "qkv":
        from qkv_side import bucketed_batches

        device = device_of(args)
        bucketed = [
            {"src": b.src.to(device), "tgt_in": b.tgt_in.to(device), "labels": b.labels.to(device)}
            for b in bucketed_batches(
                [{k: v.cpu().numpy() for k, v in b.items()} for b in batches], args.seed
            )
        ]
        result["bucketed"] = timed_rounds(
            step,
            bucketed[: args.warmup],
            bucketed[args.warmup :],
            args.repeats,
            untimed_pass_first(args),
        )
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


def time_decoding(
    system: Any,
    fn: Callable[[torch.Tensor], torch.Tensor],
    batches: list[torch.Tensor],
    n: int,
    args: Any,
    width: int = 1,
) -> float:
    """Seconds to decode every batch (beam `width`, 1 for greedy): one after the other, or as
    the system does many (`map_batches`: qkv's workers)."""
    start = time.perf_counter()
    with decoding_autocast(system, args):
        if hasattr(system, "map_batches"):
            found = system.map_batches(fn, batches, width)
        else:
            found = [fn(batch) for batch in batches]
    sync(args)
    seconds = time.perf_counter() - start
    for batch, out in zip(batches, found, strict=True):
        assert out.shape == (batch.size(0), n), (tuple(out.shape), n)
    return seconds


def phase_decode(args: Any) -> dict[str, Any]:
    shape = SHAPES[args.shape]
    torch.manual_seed(args.seed)
    probes = [first_probe(args)]
    system = build(args.system, shape, args)
    for_decoding(system, args)
    batches = decode_batches(args, shape)
    sentences = sum(b.size(0) for b in batches)
    weights = str(next(system.model.parameters()).dtype)
    result: dict[str, Any] = {"system": args.system, "meta": system.meta, "weights": weights}
    with torch.inference_mode():
        with decoding_autocast(system, args):
            system.greedy(batches[0][:4], 3)  # warm-up
        skip = int(untimed_pass_first(args))
        seconds = [
            time_decoding(
                system, lambda b: system.greedy(b, args.new_tokens), batches, args.new_tokens, args
            )
            for _ in range(skip + args.decode_repeats)
        ][skip:]
        result["greedy"] = {
            "sentences_per_s": sentences / statistics.median(seconds),
            "seconds": seconds,
        }
        result.update({f"{k}_greedy": v for k, v in memory(args).items()})
        later_probe(probes, args)
        if args.beam and hasattr(system, "beam"):
            with decoding_autocast(system, args):
                system.beam(batches[0][:2], 3, args.beam)
            seconds = [
                time_decoding(
                    system,
                    lambda b: system.beam(b, args.new_tokens, args.beam),
                    batches,
                    args.new_tokens,
                    args,
                    args.beam,
                )
                for _ in range(skip + max(1, args.decode_repeats // 2))
            ][skip:]
            result["beam"] = {
                "k": args.beam,
                "seconds": seconds,
                "sentences_per_s": sentences / statistics.median(seconds),
            }
            later_probe(probes, args)
    result.update(
        sentences=sentences,
        batch=args.infer_batch,
        new_tokens=args.new_tokens,
        **memory(args),
        probe_gflops=probes,
    )
    return result


def phase_pair(args: Any) -> dict[str, Any]:
    """qkv (A) and a peer (B) trained (`pair_part` "train") or decoding ("decode") in one
    process, their steps or batches interleaved AB BA AB ..., so that load from other processes
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
        result["decode"] = _pair_decode(args, shape, systems)
    result["probe_gflops"] = [*probes, probe_gflops(args.probe_size, args)]
    return result


def _pair_train(args: Any, shape: Shape, systems: list[Any]) -> dict[str, Any]:
    batches = train_batches(args, shape)
    steps = [step_function(s, args.lr, args) for s in systems]
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


def decoding_kinds(
    args: Any, systems: list[Any]
) -> dict[str, Callable[[Any, torch.Tensor], torch.Tensor]]:
    """Greedy, and beam search when `--beam` and every system has one: (system, batch) ->
    (B, --new-tokens) ids."""
    kinds: dict[str, Callable[[Any, torch.Tensor], torch.Tensor]] = {
        "greedy": lambda s, b: s.greedy(b, args.new_tokens)
    }
    if args.beam and all(hasattr(s, "beam") for s in systems):
        kinds["beam"] = lambda s, b: s.beam(b, args.new_tokens, args.beam)
    return kinds


def _pair_decode(args: Any, shape: Shape, systems: list[Any]) -> dict[str, Any]:
    batches = decode_batches(args, shape)
    kinds = decoding_kinds(args, systems)
    out = {}
    with torch.inference_mode():
        for system in systems:
            for_decoding(system, args)
            with decoding_autocast(system, args):
                system.greedy(batches[0][:4], 3)
        for kind, run in kinds.items():
            if untimed_pass_first(args):
                for batch in batches:
                    for system in systems:
                        with decoding_autocast(system, args):
                            run(system, batch)
            seconds: list[list[float]] = [[], []]
            for index, batch in enumerate(batches):
                for side in (0, 1) if index % 2 == 0 else (1, 0):
                    start = time.perf_counter()
                    with decoding_autocast(systems[side], args):
                        run(systems[side], batch)
                    sync(args)
                    seconds[side].append(time.perf_counter() - start)
            sentences = sum(b.size(0) for b in batches)
            out[kind] = {
                "a_sentences_per_s": sentences / sum(seconds[0]),
                "b_sentences_per_s": sentences / sum(seconds[1]),
                "ratio": sum(seconds[1]) / sum(seconds[0]),
            }
    return out
