"""qkv's decoding with its decoder's linear layers frozen for oneDNN and without, interleaved.

Both ways run the benchmark's greedy and beam search (`QkvSystem`, the benchmark model with
random weights, its decoding workload, exactly `--new-tokens` tokens per sentence) with the same
weights on the same batches, taking turns batch by batch (who goes first alternates). They
differ only in the decoder that `ModelDecoder` steps through: `frozen_copy(model.decoder)`, or
the model's own decoder; the output layer is frozen in both. Prints sentences per second of
each, their ratio, the median ratio of paired batches, and how many outputs are the same.

    python benchmarks/frozen_ab.py [--threads 2] [--passes 3] [--beam 5]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from phases import ab_decoding_parser, build, decode_batches
from torch import Tensor
from workload import SHAPES

import qkv.inference.incremental as incremental
from qkv.inference.incremental import DecodingWeights
from qkv.training.speed import tune_allocator


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Print the comparison; return its figures, by search."""
    parser = ab_decoding_parser(__doc__.splitlines()[0])
    parser.add_argument("--beam", type=int, default=5, help="0 skips beam search")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="base")
    args = parser.parse_args(argv)
    args.device = "cpu"
    torch.set_num_threads(args.threads)
    tune_allocator()
    torch.manual_seed(args.seed)
    system = build("qkv", SHAPES[args.shape])
    system.model.eval()
    batches = decode_batches(args, SHAPES[args.shape])
    searches: dict[str, Callable[[Tensor], Tensor]] = {
        "greedy": lambda batch: system.greedy(batch, args.new_tokens)
    }
    if args.beam:
        searches[f"beam-{args.beam}"] = lambda batch: system.beam(batch, args.new_tokens, args.beam)
    return {
        name: compare(name, run, system, batches, args.passes) for name, run in searches.items()
    }


def compare(
    name: str,
    run: Callable[[Tensor], Tensor],
    system: Any,
    batches: list[Tensor],
    passes: int,
) -> dict[str, Any]:
    """Both ways on every batch, `passes` times, interleaved."""
    seconds: dict[bool, list[float]] = {True: [], False: []}
    found: dict[bool, list[Tensor]] = {True: [], False: []}
    # Each way keeps its own decoding weights across batches, made at its warm-up.
    weights = {frozen: DecodingWeights(system.model) for frozen in (True, False)}
    with torch.inference_mode():
        for frozen in (True, False):  # warm-up
            system._weights = weights[frozen]
            with_frozen_decoder(frozen, run, batches[0])
        for p in range(passes):
            for i, batch in enumerate(batches):
                for frozen in sorted((True, False), reverse=(p + i) % 2 == 1):
                    system._weights = weights[frozen]
                    start = time.perf_counter()
                    tokens = with_frozen_decoder(frozen, run, batch)  # (B, L)
                    seconds[frozen].append(time.perf_counter() - start)
                    if p == 0:
                        found[frozen] += list(tokens)
    n = sum(len(batch) for batch in batches) * passes
    rates = {frozen: n / sum(s) for frozen, s in seconds.items()}
    pairs = [plain / frozen for frozen, plain in zip(seconds[True], seconds[False], strict=True)]
    same = [torch.equal(a, b) for a, b in zip(found[True], found[False], strict=True)]
    out = {
        "frozen_sent_per_s": rates[True],
        "plain_sent_per_s": rates[False],
        "ratio": rates[True] / rates[False],
        "median_pair_ratio": statistics.median(pairs),
        "same_outputs": sum(same),
        "sentences": len(found[True]),
    }
    print(
        f"{name}, frozen decoder: {out['frozen_sent_per_s']:.1f} sent/s; its own: "
        f"{out['plain_sent_per_s']:.1f} sent/s; ratio {out['ratio']:.3f} (median pair "
        f"{out['median_pair_ratio']:.3f}); same output for {out['same_outputs']} of "
        f"{out['sentences']} sentences"
    )
    return out


def with_frozen_decoder(frozen: bool, run: Callable[[Tensor], Tensor], batch: Tensor) -> Tensor:
    """`run(batch)`, its `ModelDecoder`s stepping through a frozen copy of the decoder or not."""
    made = incremental.frozen_copy
    if not frozen:
        incremental.frozen_copy = lambda module, rows: module  # type: ignore[assignment]
    try:
        return run(batch)
    finally:
        incremental.frozen_copy = made


if __name__ == "__main__":
    main()
