"""Decoding a real test set with a trained model: qkv against Hugging Face `generate`, same weights.

`bench.py` decodes random sources with random weights for exactly 50 tokens, so that every
system does the same work. Here a trained qkv run translates a real test set and sentences
end at EOS, as in use. Hugging Face gets the very same weights: `marian_from_qkv` copies a
post-norm qkv model into a `MarianMTModel` (the same architecture), and the greedy outputs of
the two are compared token for token, an independent check of qkv's model and search.

Five ways of decoding, each greedy and with beam search, timed in turn in every repeat:

- qkv and Hugging Face on the same batches of `--batch` sentences, one length budget per
  batch (qkv's rule for its longest source), in file order and sorted by source length: the
  model, cache and search, with real stopping;
- qkv's own way, `translate_ids` as `qkv translate` runs it: length-sorted batches under a
  token budget, one length budget per sentence. Its ratio is taken against Hugging Face's
  sorted batches.

With `--bf16`, two more ways: qkv's own way in bf16 (`qkv translate --bf16`: a bf16 copy of
the model, made in every pass) and Hugging Face's sorted batches with its model cast to bf16,
the first set against the second.

    python benchmarks/real_decode.py --run runs/m30k \\
        --src ../shared/data/multi30k/test_2016_flickr.de.gz \\
        --ref ../shared/data/multi30k/test_2016_flickr.en.gz --json real.json --md real.md

Needs `transformers` (`pip install -e .[bench]`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peers import MARIAN_TOKENS, marian_config
from torch import Tensor

from qkv.data.readers import read_lines
from qkv.data.special import EOS_ID, PAD_ID
from qkv.errors import QkvError
from qkv.evaluation.bleu import score_translations
from qkv.inference.beam import beam_search
from qkv.inference.incremental import DecodingWeights, ModelDecoder
from qkv.inference.search import greedy_search
from qkv.inference.translate import DecodeOptions, translate_ids
from qkv.inference.translator import Translator
from qkv.model.seq2seq import Seq2SeqTransformer

ALPHA = 0.6
"""Length penalty strength for both tools (qkv: GNMT ((5 + n) / 6) ** a; Hugging Face: n ** a)."""

PEER_OF = {
    "qkv, same batches": "hf, same batches",
    "qkv, sorted batches": "hf, sorted batches",
    "qkv, own batching": "hf, sorted batches",
    "qkv, own batching, bf16": "hf, sorted batches, bf16",
    "qkv, own batching, no graphs": "hf, sorted batches",
    "qkv, own batching, bf16, no graphs": "hf, sorted batches, bf16",
}
"""The Hugging Face way each qkv way is compared with."""


def marian_from_qkv(model: Seq2SeqTransformer) -> Any:
    """A `MarianMTModel` holding the weights of a post-norm, sinusoidal qkv model, in eval mode.

    Raises:
        ValueError: if the model is pre-norm or has learned positions (Marian has neither).
    """
    from transformers import MarianMTModel

    c = model.config
    if c.norm_first or c.positions != "sinusoidal":
        raise ValueError("only post-norm models with sinusoidal positions map onto Marian")
    tied = c.tie_embeddings and c.joint_vocab
    config = marian_config(
        src_vocab=c.vocab_size,
        tgt_vocab=c.target_vocab_size,
        d_model=c.d_model,
        n_heads=c.n_heads,
        d_ff=c.d_ff,
        n_encoder_layers=c.n_encoder_layers,
        n_decoder_layers=c.n_decoder_layers,
        activation=c.activation,
        dropout=0.0,
        max_positions=c.max_len,
        tied=tied,
    )
    marian = MarianMTModel(config)
    ours = model.state_dict()
    theirs: dict[str, Tensor] = {}

    def attention(dst: str, src: str) -> None:
        weight, bias = ours[f"{src}.in_proj.weight"], ours[f"{src}.in_proj.bias"]
        for i, name in enumerate("qkv"):  # in_proj rows: query, key, value
            rows = slice(i * c.d_model, (i + 1) * c.d_model)
            theirs[f"{dst}.{name}_proj.weight"] = weight[rows]
            theirs[f"{dst}.{name}_proj.bias"] = bias[rows]
        for part in ("weight", "bias"):
            theirs[f"{dst}.out_proj.{part}"] = ours[f"{src}.out_proj.{part}"]

    def copy(dst: str, src: str) -> None:
        for part in ("weight", "bias"):
            theirs[f"{dst}.{part}"] = ours[f"{src}.{part}"]

    for stack, n_layers in (("encoder", c.n_encoder_layers), ("decoder", c.n_decoder_layers)):
        for i in range(n_layers):
            dst, src = f"model.{stack}.layers.{i}", f"{stack}.layers.{i}"
            attention(f"{dst}.self_attn", f"{src}.self_attn")
            copy(f"{dst}.self_attn_layer_norm", f"{src}.self_attn_norm")
            if stack == "decoder":
                attention(f"{dst}.encoder_attn", f"{src}.cross_attn")
                copy(f"{dst}.encoder_attn_layer_norm", f"{src}.cross_attn_norm")
            copy(f"{dst}.fc1", f"{src}.ffn.linear1")
            copy(f"{dst}.fc2", f"{src}.ffn.linear2")
            copy(f"{dst}.final_layer_norm", f"{src}.ffn_norm")
        theirs[f"model.{stack}.embed_positions.weight"] = model.encoder.embeddings.positions(
            c.max_len
        )
    if tied:
        theirs["model.shared.weight"] = ours["encoder.embeddings.token.table.weight"]
    else:
        theirs["model.encoder.embed_tokens.weight"] = ours["encoder.embeddings.token.table.weight"]
        theirs["model.decoder.embed_tokens.weight"] = ours["decoder.embeddings.token.table.weight"]
        theirs["lm_head.weight"] = ours["output.weight"]
    missing, unexpected = marian.load_state_dict(theirs, strict=False)
    left = set(missing) - {"final_logits_bias"}  # zeros, as qkv's output layer has no bias
    if tied:  # the tables that share model.shared
        left -= {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"}
        left -= {"lm_head.weight"}
    if left or unexpected:
        raise ValueError(f"weights left unmapped: {sorted(left)}, unexpected: {unexpected}")
    return marian.eval()


@dataclass
class Batch:
    """Sentences decoded together: their positions in the test set and padded ids (B, S)."""

    rows: list[int]
    src: Tensor


def make_batches(
    sources: list[list[int]], size: int, by_length: bool, device: torch.device
) -> list[Batch]:
    """Batches of `size` sentences on `device`, in file order or sorted by source length."""
    order = list(range(len(sources)))
    if by_length:
        order.sort(key=lambda i: len(sources[i]))
    batches = []
    for start in range(0, len(order), size):
        rows = order[start : start + size]
        src = torch.full((len(rows), max(len(sources[r]) for r in rows)), PAD_ID)
        for j, r in enumerate(rows):
            src[j, : len(sources[r])] = torch.tensor(sources[r])
        batches.append(Batch(rows, src.to(device)))
    return batches


def budget(src: Tensor, options: DecodeOptions, limit: int) -> int:
    """One length budget for a batch: qkv's rule for its longest source."""
    longest = int((src != PAD_ID).sum(1).max())
    return min(max(int(longest * options.max_len_a + options.max_len_b), 1), limit)


def qkv_batches(
    model: Seq2SeqTransformer, batches: list[Batch], beam: int, options: DecodeOptions
) -> list[list[int]]:
    """qkv's search on the given batches, every sentence with its batch's budget."""
    out: list[list[int]] = [[] for _ in range(sum(len(b.rows) for b in batches))]
    weights = DecodingWeights(model)  # kept across the batches, as `translate_ids` keeps them
    for batch in batches:
        n = budget(batch.src, options, model.config.max_len - 1)
        lengths = torch.full((len(batch.rows),), n, dtype=torch.long, device=batch.src.device)
        decoder = ModelDecoder(model, batch.src, n + 1, weights=weights)
        if beam > 1:
            hyps = beam_search(decoder, len(batch.rows), beam, lengths, ALPHA)
            found = [h[0].tokens for h in hyps]
        else:
            found = greedy_search(decoder, len(batch.rows), lengths)
        for r, tokens in zip(batch.rows, found, strict=True):
            out[r] = tokens
    return out


def hf_batches(
    marian: Any, batches: list[Batch], beam: int, options: DecodeOptions, limit: int
) -> list[list[int]]:
    """Hugging Face `generate` on the given batches, each with its batch's budget."""
    from transformers import GenerationConfig

    out: list[list[int]] = [[] for _ in range(sum(len(b.rows) for b in batches))]
    for batch in batches:
        config = GenerationConfig(
            max_new_tokens=budget(batch.src, options, limit),
            do_sample=False,
            num_beams=beam,
            length_penalty=ALPHA,
            early_stopping=True,
            **MARIAN_TOKENS,
            use_cache=True,
        )
        generated = marian.generate(
            input_ids=batch.src, attention_mask=batch.src != PAD_ID, generation_config=config
        )  # (B, 1 + T): the start token first
        for r, ids in zip(batch.rows, generated[:, 1:].tolist(), strict=True):
            out[r] = ids[: ids.index(EOS_ID)] if EOS_ID in ids else ids
    return out


def positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return int(text)


def agreement(found: list[list[int]], other: list[list[int]]) -> float:
    """The fraction of sentences translated into exactly the same tokens."""
    return sum(a == b for a, b in zip(found, other, strict=True)) / max(len(found), 1)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Print the table; return (and optionally write) the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a trained `qkv train translation` run")
    parser.add_argument("--src", required=True, help="source sentences, one per line")
    parser.add_argument("--ref", required=True, help="reference translations, one per line")
    parser.add_argument("--batch", type=positive, default=64, help="sentences per batch")
    parser.add_argument("--beam", type=positive, default=5)
    parser.add_argument("--repeats", type=positive, default=3)
    parser.add_argument("--threads", type=positive, default=2)
    parser.add_argument("--sentences", type=int, default=0, help="the first N only (0: all)")
    parser.add_argument("--bf16", action="store_true", help="also decode in bf16, both tools")
    parser.add_argument(
        "--device", default="cpu", help="cpu or cuda (on a GPU, qkv's own way also without graphs)"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--md", type=Path)
    args = parser.parse_args(argv)
    try:
        import transformers
    except ImportError:
        sys.exit("real_decode.py needs transformers: pip install -e .[bench]")

    torch.set_num_threads(args.threads)
    try:
        translator = Translator.load(args.run, device=args.device)
        marian = marian_from_qkv(translator.model).to(translator.device)
        sources_text, references = read_lines(args.src), read_lines(args.ref)
    except (QkvError, ValueError) as error:
        sys.exit(f"real_decode.py: {error}")
    model, tokenizer = translator.model, translator.tokenizer
    if len(sources_text) != len(references):
        sys.exit(f"{args.src} has {len(sources_text)} lines but {args.ref} {len(references)}")
    if args.sentences:
        sources_text, references = sources_text[: args.sentences], references[: args.sentences]
    sources = translator.encode(sources_text)
    options = DecodeOptions()
    limit = model.config.max_len - 1
    device = translator.device
    in_order = make_batches(sources, args.batch, by_length=False, device=device)
    by_length = make_batches(sources, args.batch, by_length=True, device=device)

    def own_qkv(beam: int, bf16: bool = False, graphs: bool = True) -> list[list[int]]:
        decode = DecodeOptions(beam_size=beam, alpha=ALPHA, bf16=bf16, cuda_graphs=graphs)
        return translate_ids(model, sources, decode, device)

    ways: dict[str, Callable[[int], list[list[int]]]] = {
        "qkv, same batches": lambda beam: qkv_batches(model, in_order, beam, options),
        "hf, same batches": lambda beam: hf_batches(marian, in_order, beam, options, limit),
        "qkv, sorted batches": lambda beam: qkv_batches(model, by_length, beam, options),
        "hf, sorted batches": lambda beam: hf_batches(marian, by_length, beam, options, limit),
        "qkv, own batching": own_qkv,
    }
    if args.bf16:
        marian_bf16 = marian_from_qkv(model).to(device, torch.bfloat16)
        ways["qkv, own batching, bf16"] = lambda beam: own_qkv(beam, bf16=True)
        ways["hf, sorted batches, bf16"] = lambda beam: hf_batches(
            marian_bf16, by_length, beam, options, limit
        )
    if device.type == "cuda":  # qkv's own way as `qkv translate --no-cuda-graphs` runs it
        ways["qkv, own batching, no graphs"] = lambda beam: own_qkv(beam, graphs=False)
        if args.bf16:
            ways["qkv, own batching, bf16, no graphs"] = lambda beam: own_qkv(
                beam, bf16=True, graphs=False
            )
    searches = {"greedy": 1, f"beam-{args.beam}": args.beam}
    seconds: dict[tuple[str, str], list[float]] = {}
    outputs: dict[tuple[str, str], list[list[int]]] = {}
    with torch.inference_mode():
        for beam in searches.values():  # one warm-up pass each, untimed
            ways["qkv, same batches"](beam)
            ways["hf, same batches"](beam)
        for _ in range(args.repeats):
            for search, beam in searches.items():
                for way, decode in ways.items():
                    start = time.perf_counter()
                    outputs[way, search] = decode(beam)
                    seconds.setdefault((way, search), []).append(time.perf_counter() - start)

    results: dict[str, Any] = {
        "run": str(args.run),
        "src": str(args.src),
        "sentences": len(sources),
        "batch": args.batch,
        "threads": args.threads,
        "repeats": args.repeats,
        "bf16": args.bf16,
        "device": str(device),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "rows": [],
    }
    for search in searches:
        for way in ways:
            found = outputs[way, search]
            median = statistics.median(seconds[way, search])
            scores = score_translations(tokenizer.decode_batch(found), references)
            peer = outputs.get((PEER_OF.get(way, ""), search))
            results["rows"].append(
                {
                    "search": search,
                    "way": way,
                    "seconds": median,
                    "sentences_per_s": len(sources) / median,
                    "tokens_per_s": sum(len(t) + 1 for t in found) / median,
                    "bleu": scores.bleu,
                    "chrf": scores.chrf,
                    "same_as_hf": None if peer is None else agreement(found, peer),
                }
            )
    markdown = report(results)
    print(markdown)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    if args.md:
        args.md.write_text(markdown + "\n", encoding="utf-8")
    return results


def report(results: dict[str, Any]) -> str:
    """A markdown table; each qkv row is set against the Hugging Face way of `PEER_OF`."""
    lines = [
        f"{results['sentences']} sentences, batches of {results['batch']}, "
        f"{results['threads']} threads, median of {results['repeats']}, "
        f"device {results.get('device', 'cpu')}",
        "",
        "| search | way | sent/s | tok/s | BLEU | chrF | same tokens as hf | qkv / hf |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    speed = {(r["search"], r["way"]): r["sentences_per_s"] for r in results["rows"]}
    for r in results["rows"]:
        peer = PEER_OF.get(r["way"])
        ratio = f"{r['sentences_per_s'] / speed[r['search'], peer]:.2f}×" if peer else ""
        same = "" if r["same_as_hf"] is None else f"{100 * r['same_as_hf']:.1f} %"
        lines.append(
            f"| {r['search']} | {r['way']} | {r['sentences_per_s']:.1f} | "
            f"{r['tokens_per_s']:,.0f} | {r['bleu']:.2f} | {r['chrf']:.2f} | "
            f"{same} | {ratio} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
