"""Where a qkv decoding step goes: wall-clock milliseconds per step, by part.

The parts are timed with `time.perf_counter` around the methods that do them (no profiler: its
per-op overhead distorts steps of a few milliseconds), on the decoding workload of the
benchmark (batch `--infer-batch`, exactly `--new-tokens` tokens, greedy and beam search).
`bench.py` runs it in its profile phase; on its own:

    python benchmarks/profile_decode.py [--threads 2] [--beam 5] [--dtype bf16] [--shape narrow]

`--shape narrow` runs the same layers and heads 16 wide: a step's per-operation overhead.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from phases import PartTimers, build, decode_batches, for_decoding
from workload import SHAPES

import qkv.inference.beam as beam_module
import qkv.inference.incremental as incremental
import qkv.model.attention as attention_module
from qkv.inference.incremental import ModelDecoder
from qkv.model.kv_cache import DecoderCache, KVCache

ENCODER = "encoder (once per batch)"
STEP = "model step (decoder layers + output layer)"
LAYERS = "  decoder layers"
OUTPUT = "  output layer"
REORDER = "cache reorder (select)"
SEARCH = "beam search step (log-softmax, top-k, bookkeeping)"
REST = "greedy bookkeeping and the rest"
LAYER_PARTS = (
    LAYERS,
    "    self-attention q/k/v projection",
    "    cross-attention q projection",
    "    attention output projections",
    "    feed-forward",
    "    layer norms",
)
TOP_LEVEL = (ENCODER, STEP, REORDER, SEARCH)
"""Parts that do not overlap; the indented ones are inside the model step."""


@contextmanager
def timers(system: Any) -> Iterator[dict[str, float]]:
    """Wrap the parts of a decoding step with timers; yields seconds per part, summed."""
    clock = PartTimers()
    wrap, seconds = clock.wrap, clock.seconds
    seconds[ENCODER] += 0.0  # report the parts in this order
    wrap(ModelDecoder, "step", STEP)
    wrap(ModelDecoder, "step_argmax", STEP)
    made = incremental.frozen_copy

    def timed_copy(model: Any, rows: int, keep: Any = ()) -> Any:
        """The copy of the model that `ModelDecoder` encodes and steps through, its parts
        wrapped (not the model's own modules: the copy would call the wrappers' originals)."""
        twin = made(model, rows, keep)
        wrap(twin, "encode", ENCODER)
        wrap(twin.decoder, "step", LAYERS)
        qkv, q, out, ffn, norms = LAYER_PARTS[1:]
        for layer in twin.decoder.layers:
            wrap(layer.self_attn.in_proj, "forward", qkv)
            wrap(layer.cross_attn, "project_q", q)
            wrap(layer.self_attn.out_proj, "forward", out)
            wrap(layer.cross_attn.out_proj, "forward", out)
            wrap(layer.ffn, "forward", ffn)
            for norm in (layer.self_attn_norm, layer.cross_attn_norm, layer.ffn_norm):
                wrap(norm, "forward", norms)
        return twin

    incremental.frozen_copy = timed_copy
    system._weights = None  # the frozen copy is made again, through `timed_copy`
    for part in LAYER_PARTS:
        seconds[part] += 0.0  # report the parts in this order
    wrap(attention_module, "cached_attention", "    attention over the caches")
    wrap(KVCache, "append", "    cache append")
    seconds[OUTPUT] += 0.0  # the model step less its decoder layers
    wrap(DecoderCache, "select", REORDER)
    wrap(beam_module, "_advance", SEARCH)
    try:
        yield seconds
    finally:
        incremental.frozen_copy = made
        system._weights = None  # not the timed copy
        clock.restore()


def decode_split(args: Any) -> dict[str, Any]:
    """Milliseconds per decoding step, by part, for greedy and beam search."""
    shape = SHAPES[args.shape]
    torch.manual_seed(args.seed)
    system = build("qkv", shape)
    for_decoding(system, args)  # bf16 weights in a `--dtype bf16` run
    batches = decode_batches(args, shape)
    kinds: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "greedy": lambda b: system.greedy(b, args.new_tokens)
    }
    if args.beam:
        kinds[f"beam-{args.beam}"] = lambda b: system.beam(b, args.new_tokens, args.beam)
    out: dict[str, Any] = {}
    with torch.inference_mode():
        for kind, run in kinds.items():
            with timers(system) as seconds:
                run(batches[0])  # warm-up; it makes the frozen weights, kept across batches
                for part in seconds:
                    seconds[part] = 0.0
                start = time.perf_counter()
                for batch in batches:
                    run(batch)
                total = time.perf_counter() - start
            steps = args.new_tokens * len(batches)
            parts = {k: 1000 * v / steps for k, v in seconds.items()}
            parts[OUTPUT] = parts[STEP] - parts[LAYERS]  # the (N, D) x (D, V) projection
            parts[REST] = 1000 * total / steps - sum(parts.get(k, 0.0) for k in TOP_LEVEL)
            out[kind] = {"step_ms": 1000 * total / steps, "parts_ms": parts}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="base")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--infer-batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=50)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="bf16 weights")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from report import decode_split as table

    print("\n".join(table(decode_split(args))))


if __name__ == "__main__":
    main()
