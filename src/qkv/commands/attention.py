"""`qkv attention`: draw the attention maps a trained run computes for one input.

A translation run translates the source greedily, then runs the source and the BOS-prefixed
output through the model once more for every map; a classification run has only encoder
self-attention, and the title names the predicted label.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from qkv.data.readers import is_blank, lone_surrogate
from qkv.errors import ConfigError

ENCODER_SELF, DECODER_SELF, CROSS = "encoder self", "decoder self", "cross"
KINDS = (ENCODER_SELF, DECODER_SELF, CROSS)


@dataclass
class SentenceAttention:
    """Every attention map of one input, by kind, with the tokens that label its axes."""

    maps: dict[str, list[Tensor]]  # one (H, Tq, Tk) tensor per layer
    query_tokens: dict[str, list[str]]  # the Tq row labels
    key_tokens: dict[str, list[str]]  # the Tk column labels
    title: str  # what the model made of the input, e.g. "3 March 2021 → 2021-03-03"


def run(args: argparse.Namespace) -> int:
    kinds = parse_kinds(args.kinds)
    layers = parse_indices(args.layers, "--layers")
    heads = parse_indices(args.heads, "--heads")
    path = draw_attention(args.run_dir, args.sentence, args.out, kinds, layers, heads)
    print(f"wrote {path}")
    return 0


def parse_kinds(text: str | None) -> list[str] | None:
    """ "encoder self, cross" -> ["encoder self", "cross"], hyphens and underscores read as
    spaces; None or blank gives None (every kind)."""
    if text is None or not text.strip():
        return None
    return list(dict.fromkeys(_kind(item) for item in text.split(",")))


def _kind(item: str) -> str:
    kind = " ".join(item.replace("-", " ").replace("_", " ").lower().split())
    if kind not in KINDS:
        raise ConfigError(
            f"unknown attention kind {item.strip()!r}; choose from {', '.join(KINDS)}"
        )
    return kind


def parse_indices(text: str | None, flag: str) -> list[int] | None:
    """ "0,2" -> [0, 2]; None or blank gives None (all)."""
    if text is None or not text.strip():
        return None
    indices = []
    for item in text.split(","):
        try:
            index = int(item.strip())
        except ValueError:
            raise ConfigError(
                f"{flag} takes comma-separated 0-based numbers such as 0,2; got {item.strip()!r}"
            ) from None
        if index < 0:
            raise ConfigError(f"{flag} indices are 0-based and cannot be negative; got {index}")
        indices.append(index)
    return indices


def draw_attention(
    run_dir: str | Path,
    text: str,
    out: str | Path,
    kinds: Sequence[str] | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
) -> Path:
    """Draws the attention maps of one input (a source sentence or a text to classify) to a
    picture (PNG, SVG, PDF, ...); returns its path. None for `kinds`, `layers` or `heads`
    draws all the model has."""
    from qkv.viz.attention import plot_attention, select_panels

    wanted = list(KINDS) if kinds is None else [_kind(kind) for kind in kinds]
    attention = sentence_attention(run_dir, text)
    chosen = {kind: attention.maps[kind] for kind in wanted if kind in attention.maps}
    if not chosen:
        raise ConfigError(
            f"this model has no {' or '.join(wanted)} attention; it has {', '.join(attention.maps)}"
        )
    panels = select_panels(chosen, attention.query_tokens, attention.key_tokens, layers, heads)
    return plot_attention(panels, out, title=attention.title)


def sentence_attention(run_dir: str | Path, text: str) -> SentenceAttention:
    """Runs one input through a run's model and returns every attention map."""
    from qkv.run import RunConfig

    if is_blank(text):
        raise ConfigError("the sentence to draw attention for is empty")
    if lone_surrogate(text) is not None:
        raise ConfigError("the sentence to draw attention for is not valid UTF-8 text")
    run_dir = Path(run_dir)
    if RunConfig.load(run_dir).task == "translation":
        return _translation_attention(run_dir, text)
    return _classification_attention(run_dir, text)


@torch.no_grad()
def _translation_attention(run_dir: Path, text: str) -> SentenceAttention:
    from qkv.data.special import BOS_ID
    from qkv.inference.translate import DecodeOptions, translate_ids
    from qkv.inference.translator import Translator

    translator = Translator.load(run_dir, device="cpu")
    model, tokenizer = translator.model, translator.tokenizer
    src_ids = translator.encode([text])[0]
    if not src_ids:
        raise ConfigError(f"{text!r} has no tokens to attend to")
    output_ids = translate_ids(model, [src_ids], DecodeOptions(beam_size=1), translator.device)[0]
    tgt_in = [BOS_ID, *output_ids]
    _, maps = model.forward_with_maps(torch.tensor([src_ids]), torch.tensor([tgt_in]))
    src_tokens = tokenizer.tokens_from_ids(src_ids)
    tgt_tokens = tokenizer.tokens_from_ids(tgt_in)
    return SentenceAttention(
        maps={
            ENCODER_SELF: [m[0] for m in maps.encoder_self],  # (H, S, S) per layer
            DECODER_SELF: [m[0] for m in maps.decoder_self],  # (H, T, T)
            CROSS: [m[0] for m in maps.cross],  # (H, T, S)
        },
        query_tokens={ENCODER_SELF: src_tokens, DECODER_SELF: tgt_tokens, CROSS: tgt_tokens},
        key_tokens={ENCODER_SELF: src_tokens, DECODER_SELF: tgt_tokens, CROSS: src_tokens},
        title=f"{text.strip()} → {tokenizer.decode(output_ids)}",
    )


@torch.no_grad()
def _classification_attention(run_dir: Path, text: str) -> SentenceAttention:
    from qkv.data.special import CLS_ID
    from qkv.inference.classifier import Classifier
    from qkv.tasks.classification import encode_texts

    classifier = Classifier.load(run_dir, device="cpu")
    ids = encode_texts(classifier.tokenizer, [text], classifier.data)[0]  # what `classify` sees
    if not ids:
        raise ConfigError(f"{text!r} has no tokens to attend to")
    if classifier.data.cls:
        ids = [CLS_ID, *ids]
    logits, maps = classifier.model.forward_with_maps(torch.tensor([ids]))  # (1, C)
    probabilities = logits[0].softmax(-1)  # (C,)
    predicted = int(probabilities.argmax())
    tokens = classifier.tokenizer.tokens_from_ids(ids)
    return SentenceAttention(
        maps={ENCODER_SELF: [m[0] for m in maps.encoder_self]},  # (H, S, S) per layer
        query_tokens={ENCODER_SELF: tokens},
        key_tokens={ENCODER_SELF: tokens},
        title=f"predicted: {classifier.labels[predicted]} ({float(probabilities[predicted]):.0%})",
    )
