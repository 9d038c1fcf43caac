"""qkv's decoding with one of its decoding measures and without, interleaved.

Both ways run the benchmark's greedy and beam search (`QkvSystem`, the benchmark model with
random weights, its decoding workload, exactly `--new-tokens` tokens per sentence) with the same
weights on the same batches, taking turns batch by batch (who goes first alternates). They
differ only in the measure that `--change` names:

- `decoder`: `ModelDecoder` steps through `frozen_copy(model.decoder)`, or through the
  model's own decoder (the output layer is frozen both ways);
- `encoder`: `ModelDecoder` encodes through a frozen copy of the encoder too, or through the
  model's own encoder, as shipped (the decoder frozen both ways);
- `kept`: the frozen weights (`DecodingWeights`) are kept across batches, or made again for
  every batch;
- `query`: cross-attention's query projection is a frozen part of its packed projection
  (`FrozenLinear.part`), or `F.linear` on the sliced weight;
- `cache-attention`: attention over the caches is `cached_attention`'s two batched matmuls,
  or torch's fused `F.scaled_dot_product_attention`;
- `int8-screen`: greedy's screen of the output layer is an int8 product, or a bf16 one (where
  this CPU's int8 products are exact; `OutputLayer`);
- `step-major`: the self-attention caches are step-major, (T_max, N, H, K), or row-major,
  (N, H, T_max, K), whose rows then move whole (`KVCache`);
- `held`: beam search's reordering copies only the cached steps that a row's new place does
  not hold already, or whole rows (`DecoderCache.select`);
- `layer-step`: a decoding step goes through the decoder layers' `step` (the cross-attention
  mask a bias added by the first matmul), or through their `forward` with a cache, as
  training's layers do (the mask filled into the scores, the inputs checked).

Each way but `kept`'s "off" keeps its own frozen weights across batches, made at its warm-up.
Prints sentences per second of each, their ratio, the median ratio of paired batches, and how
many outputs are the same.

    python benchmarks/frozen_ab.py
        [--change decoder|encoder|kept|query|cache-attention|int8-screen|step-major|held
                  |layer-step]
        [--threads 2] [--passes 3]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from phases import ab_decoding_parser, build, decode_batches
from torch import Tensor
from workload import SHAPES

import qkv.inference.incremental as incremental
import qkv.inference.output_layer as output_layer
import qkv.model.attention as attention
import qkv.model.seq2seq as seq2seq
from qkv.inference.incremental import DecodingWeights
from qkv.model.decoder import Decoder
from qkv.model.frozen_linear import frozen_copy
from qkv.model.kv_cache import ChangedSteps, KVCache
from qkv.model.seq2seq import Seq2SeqTransformer
from qkv.training.speed import tune_allocator

CHANGES = {
    "decoder": "frozen decoder",
    "encoder": "frozen encoder",
    "kept": "frozen weights kept across batches",
    "query": "frozen cross-attention query",
    "cache-attention": "batched matmuls over the caches",
    "int8-screen": "int8 screen",
    "step-major": "step-major caches",
    "held": "held steps left in place",
    "layer-step": "the decoder layers' own step",
}
"""What each `--change` compares, as the report names its "on" way."""


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Print the comparison; return its figures, by search."""
    parser = ab_decoding_parser(__doc__.splitlines()[0])
    parser.add_argument("--change", choices=sorted(CHANGES), default="decoder")
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
        name: compare(name, run, system, args.change, batches, args.passes)
        for name, run in searches.items()
    }


def compare(
    name: str,
    run: Callable[[Tensor], Tensor],
    system: Any,
    change: str,
    batches: list[Tensor],
    passes: int,
) -> dict[str, Any]:
    """Both ways on every batch, `passes` times, interleaved."""
    seconds: dict[bool, list[float]] = {True: [], False: []}
    found: dict[bool, list[Tensor]] = {True: [], False: []}
    weights = {on: DecodingWeights(system.model) for on in (True, False)}
    with torch.inference_mode():
        for on in (True, False):  # warm-up
            with way(change, on, system, weights[on]):
                run(batches[0])
        for p in range(passes):
            for i, batch in enumerate(batches):
                for on in sorted((True, False), reverse=(p + i) % 2 == 1):
                    with way(change, on, system, weights[on]):
                        start = time.perf_counter()
                        tokens = run(batch)  # (B, L)
                        seconds[on].append(time.perf_counter() - start)
                    if p == 0:
                        found[on] += list(tokens)
    n = sum(len(batch) for batch in batches) * passes
    rates = {on: n / sum(s) for on, s in seconds.items()}
    pairs = [off / on for on, off in zip(seconds[True], seconds[False], strict=True)]
    same = [torch.equal(a, b) for a, b in zip(found[True], found[False], strict=True)]
    out = {
        "change": change,
        "on_sent_per_s": rates[True],
        "off_sent_per_s": rates[False],
        "ratio": rates[True] / rates[False],
        "median_pair_ratio": statistics.median(pairs),
        "same_outputs": sum(same),
        "sentences": len(found[True]),
    }
    print(
        f"{name}, {CHANGES[change]}: {out['on_sent_per_s']:.1f} sent/s; without: "
        f"{out['off_sent_per_s']:.1f} sent/s; ratio {out['ratio']:.3f} (median pair "
        f"{out['median_pair_ratio']:.3f}); same output for {out['same_outputs']} of "
        f"{out['sentences']} sentences"
    )
    return out


def _everything_frozen(
    model: Seq2SeqTransformer, rows: int, keep: Collection[str] = ()
) -> Seq2SeqTransformer:
    """`frozen_copy(model)` with no child kept as it is: the encoder frozen too."""
    return frozen_copy(model, rows)


def _fused_attention(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None, guard: bool = False
) -> Tensor:
    """`cached_attention` by torch's fused kernel (the benchmark's sources are never empty)."""
    mask = None if bias is None else bias.view(q.size(0), q.size(1), 1, -1)  # (B, H, 1, S)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class _RowMajorKVCache(KVCache):
    """`KVCache` with row-major (N, H, T_max, K) buffers, grown row-major too, whose rows move
    whole."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        shape, dtype, device = self.keys.shape, self.keys.dtype, self.keys.device
        self._all_keys = self.keys = torch.empty(shape, dtype=dtype, device=device)
        self._all_values = self.values = torch.empty(shape, dtype=dtype, device=device)

    def select(self, rows: Tensor, steps: ChangedSteps | None = None) -> None:
        super().select(rows)  # whole rows: `steps` index step-major buffers

    def _empty(self, rows: int) -> Tensor:
        return self._all_keys.new_empty(rows, *self._all_keys.shape[1:])  # (N, H, T_max, K)


def _select_whole_rows(
    decoder: incremental.ModelDecoder, rows: Tensor, held: Tensor | None = None
) -> None:
    """`ModelDecoder.select` that copies whole rows: `held` not passed on."""
    decoder.cache.select(rows)


def _step_through_forward(self: Decoder, ids: Tensor, cache: Any) -> Tensor:
    """`Decoder.step` through each layer's `forward` with its cache."""
    x = self.embeddings(ids, offset=cache.length)  # (N, 1, D)
    for layer, self_cache, keys, values in zip(
        self.layers, cache.self_attn, cache.cross_keys, cache.cross_values, strict=True
    ):
        x, _, _ = layer(x, (keys, values), None, cache.src_mask, cache=self_cache)
    return self.final_norm(x)  # (N, 1, D)


class _Nothing:
    """A class of which no layer is an instance."""


@contextmanager
def way(change: str, on: bool, system: Any, weights: DecodingWeights) -> Iterator[None]:
    """Decoding with the measure `change` (`on`) or without; everything put back after."""
    made, frozen_linear = incremental.frozen_copy, attention.FrozenLinear
    cached, exact_int8 = attention.cached_attention, output_layer.int8_matmuls_exact
    cache, select = seq2seq.KVCache, incremental.ModelDecoder.select
    step = Decoder.step
    system._weights = None if change == "kept" and not on else weights
    if change == "decoder" and not on:
        incremental.frozen_copy = lambda module, rows, keep=(): module  # type: ignore[assignment]
    if change == "encoder" and on:
        incremental.frozen_copy = _everything_frozen  # type: ignore[assignment]
    if change == "query" and not on:
        attention.FrozenLinear = _Nothing  # type: ignore[misc, assignment]
    if change == "cache-attention" and not on:
        attention.cached_attention = _fused_attention  # type: ignore[assignment]
    if change == "int8-screen" and not on:  # the output layer, made at the warm-up, in bf16
        output_layer.int8_matmuls_exact = lambda: False  # type: ignore[assignment]
    if change == "step-major" and not on:
        seq2seq.KVCache = _RowMajorKVCache  # type: ignore[misc]
    if change == "held" and not on:
        incremental.ModelDecoder.select = _select_whole_rows  # type: ignore[method-assign]
    if change == "layer-step" and not on:
        Decoder.step = _step_through_forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        Decoder.step = step  # type: ignore[method-assign]
        incremental.frozen_copy, attention.FrozenLinear = made, frozen_linear
        attention.cached_attention, output_layer.int8_matmuls_exact = cached, exact_int8
        seq2seq.KVCache = cache  # type: ignore[misc]
        incremental.ModelDecoder.select = select  # type: ignore[method-assign]
        system._weights = None


if __name__ == "__main__":
    main()
