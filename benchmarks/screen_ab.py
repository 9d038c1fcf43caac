"""qkv's greedy decoding with its output layer's argmax screened and without, interleaved.

Both ways run `greedy_search` over `ModelDecoder` with the same weights on the same batches,
taking turns batch by batch (who goes first alternates); they differ only in
`OutputLayer.screens` (the screen in int8 or bf16, as `OutputLayer` makes it on this CPU;
`frozen_ab.py --change int8-screen` sets the two against each other). Prints sentences per
second of each, their ratio, the median ratio of paired batches, the screen's candidates per
row, and whether the tokens are the same.

By default: the benchmark model (random weights) and its decoding workload, EOS masked so that
every sentence gets exactly `--new-tokens` tokens. With `--run RUN --src FILE`: a trained run on
real sentences, which end at EOS, batches of `--infer-batch` in file order; adding
`--own-batching`, the whole file at a time through `translate_ids`, as `qkv translate` decodes
it (length-sorted batches under a token budget, a length budget per sentence).

    python benchmarks/screen_ab.py [--threads 2] [--passes 3]
    python benchmarks/screen_ab.py --calls      # single calls, by number of rows
    python benchmarks/screen_ab.py --run runs/m30k \\
        --src ../shared/data/multi30k/test_2016_flickr.de.gz [--own-batching]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from phases import ab_decoding_parser, best_ms, build, decode_batches
from torch import Tensor
from workload import EOS, SHAPES

from qkv.data.readers import read_lines
from qkv.data.special import PAD_ID
from qkv.inference.incremental import ModelDecoder
from qkv.inference.output_layer import OutputLayer
from qkv.inference.search import greedy_search
from qkv.inference.translate import DecodeOptions, translate_ids
from qkv.inference.translator import Translator
from qkv.model.seq2seq import Seq2SeqTransformer
from qkv.training.speed import tune_allocator


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Print the comparison; return its figures."""
    parser = ab_decoding_parser(__doc__.splitlines()[0])
    parser.add_argument("--run", help="a trained translation run (default: the benchmark model)")
    parser.add_argument("--src", help="source sentences, one per line (with --run)")
    parser.add_argument("--own-batching", action="store_true", help="with --run: translate_ids")
    parser.add_argument(
        "--calls", action="store_true", help="time single output-layer calls by number of rows"
    )
    parser.add_argument("--repeats", type=int, default=200, help="calls per round with --calls")
    args = parser.parse_args(argv)
    args.device = "cpu"
    torch.set_num_threads(args.threads)
    tune_allocator()
    if args.calls:
        return time_calls(args.seed, args.repeats)
    units, sentences = workload(args)
    seconds: dict[bool, list[float]] = {True: [], False: []}
    found: dict[bool, list[list[int]]] = {True: [], False: []}
    with torch.inference_mode(), counting_candidates() as candidates:
        for screen in (True, False):  # warm-up
            units[0](screen)
        candidates.clear()
        for p in range(args.passes):
            for i, unit in enumerate(units):
                for screen in sorted((True, False), reverse=(p + i) % 2 == 1):
                    start = time.perf_counter()
                    tokens = unit(screen)
                    seconds[screen].append(time.perf_counter() - start)
                    if p == 0:
                        found[screen] += tokens
    n = sentences * args.passes
    rates = {screen: n / sum(s) for screen, s in seconds.items()}
    pairs = [off / on for on, off in zip(seconds[True], seconds[False], strict=True)]
    rows = max(sum(len(t) for t in found[True]) * args.passes, 1)  # greedy steps, one per token
    out = {
        "screened_sent_per_s": rates[True],
        "float32_sent_per_s": rates[False],
        "ratio": rates[True] / rates[False],
        "median_pair_ratio": statistics.median(pairs),
        "candidates_per_row": sum(candidates) / rows,
        "same_tokens": sum(a == b for a, b in zip(found[True], found[False], strict=True)),
        "sentences": len(found[True]),
    }
    print(
        f"greedy, screened: {out['screened_sent_per_s']:.1f} sent/s; float32 logits: "
        f"{out['float32_sent_per_s']:.1f} sent/s; ratio {out['ratio']:.3f} (median pair "
        f"{out['median_pair_ratio']:.3f}); {out['candidates_per_row']:.2f} candidates per row; "
        f"same tokens for {out['same_tokens']} of {out['sentences']} sentences"
    )
    return out


CALL_ROWS = (1, 4, 16, 32, 64, 128)


def time_calls(seed: int, repeats: int) -> dict[str, Any]:
    """Milliseconds of one `OutputLayer.argmax` call, screened and from the float32 logits, on
    the benchmark model's output layer and layer-normed random states (best of 5 rounds)."""
    torch.manual_seed(seed)
    model = build("qkv", SHAPES["base"]).model.eval()
    out: dict[str, Any] = {}
    with torch.inference_mode():
        for rows in CALL_ROWS:
            d = model.config.d_model
            x = torch.nn.functional.layer_norm(torch.randn(rows, d), (d,))  # (N, D)
            screened, plain = (OutputLayer(model.output, rows, screen=s) for s in (True, False))
            timing = {"passes": 5, "calls": repeats, "warmups": 10}
            ms = {
                "screened": best_ms(partial(screened.argmax, x), **timing),
                "float32": best_ms(partial(plain.argmax, x), **timing),
            }
            out[str(rows)] = ms
            print(
                f"{rows} rows: screened {ms['screened']:.3f} ms, float32 logits "
                f"{ms['float32']:.3f} ms, ratio {ms['float32'] / ms['screened']:.2f}"
            )
    return out


Unit = Callable[[bool], list[list[int]]]
"""Decodes a part of the workload greedily, with the screen or without; returns its tokens."""


def workload(args: Any) -> tuple[list[Unit], int]:
    """The parts of the workload, timed one by one, and its number of sentences."""
    if args.run is None:
        torch.manual_seed(args.seed)
        shape = SHAPES["base"]
        model = build("qkv", shape).model.eval()
        batches = decode_batches(args, shape)
        n = args.new_tokens
        units = [partial(decode, model, batch, n, (EOS,)) for batch in batches]
        return units, sum(b.size(0) for b in batches)
    translator = Translator.load(args.run, device="cpu")
    ids = translator.encode(read_lines(args.src))
    if args.own_batching:
        options, device = DecodeOptions(beam_size=1), torch.device("cpu")
        model = translator.model

        def translate_all(screen: bool) -> list[list[int]]:
            return screened(screen, translate_ids, model, ids, options, device)

        return [translate_all], len(ids)
    batches = []
    for i in range(0, len(ids), args.infer_batch):
        chunk = ids[i : i + args.infer_batch]
        width = max(len(s) for s in chunk)
        batches.append(torch.tensor([s + [PAD_ID] * (width - len(s)) for s in chunk]))
    budget = min(max(b.size(1) for b in batches) + 50, translator.model.config.max_len - 1)
    return [partial(decode, translator.model, batch, budget, ()) for batch in batches], len(ids)


def decode(
    model: Seq2SeqTransformer, src: Tensor, budget: int, never: tuple[int, ...], screen: bool
) -> list[list[int]]:
    decoder = ModelDecoder(model, src, budget, never)
    decoder.output.screens = screen
    lengths = torch.full((src.size(0),), budget, dtype=torch.long)
    return greedy_search(decoder, src.size(0), lengths)


def screened(screen: bool, run: Callable[..., list[list[int]]], *args: Any) -> list[list[int]]:
    """`run(*args)` with every `OutputLayer` made meanwhile screening as it would, or not."""
    made = OutputLayer.__init__

    def init(self: OutputLayer, *a: Any, **k: Any) -> None:
        made(self, *a, **k)
        self.screens = self.screens and screen

    OutputLayer.__init__ = init  # type: ignore[method-assign]
    try:
        return run(*args)
    finally:
        OutputLayer.__init__ = made  # type: ignore[method-assign]


@contextmanager
def counting_candidates() -> Iterator[list[int]]:
    """Within: how many candidates each screened call settles in float32, call by call."""
    counts: list[int] = []
    screened_argmax = OutputLayer._screened

    def counting(self: OutputLayer, x: Tensor) -> Tensor:
        found = screened_argmax(self, x)
        counts.append(self.candidates)
        return found

    OutputLayer._screened = counting  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        OutputLayer._screened = screened_argmax  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
