"""Attention weights of one text, as JSON for the web page: the model's own softmax weights,
from one more forward pass of the PyTorch model over the input (and its translation)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from qkv.data.special import BOS_ID, CLS_ID
from qkv.inference.classifier import Classifier
from qkv.inference.translator import Translator
from qkv.model.masks import padding_mask
from qkv.tasks.classification import encode_texts

DIGITS = 4


def _rounded(maps: list[Tensor]) -> list[Any]:
    """Per layer (1, H, Q, K) -> nested lists [layer][head][query][key], rounded (in float64,
    whose Python floats print as rounded; float32's print with a tail of digits)."""
    return [torch.round(m[0].double(), decimals=DIGITS).tolist() for m in maps]


@torch.no_grad()
def translation_attention(translator: Translator, text: str, output: list[int]) -> dict[str, Any]:
    """Encoder self (S x S), decoder self (T x T) and cross (T x S) attention for `text` and
    its translation `output` (ids, no BOS/EOS); row t of the decoder's maps is the step that
    chose target token t (BOS is the first input, the output tokens the rest)."""
    model, tokenizer = translator.model, translator.tokenizer
    source = translator.encode([text])[0]
    target_in = [BOS_ID, *output]
    device = next(model.parameters()).device
    src = torch.tensor([source], device=device)  # (1, S)
    tgt = torch.tensor([target_in], device=device)  # (1, T)
    _, maps = model.eval().forward_with_maps(src, tgt)
    return {
        "source_tokens": tokenizer.tokens_from_ids(source),
        "target_tokens": [*tokenizer.tokens_from_ids(output), "</s>"],
        "encoder": _rounded(maps.encoder_self),
        "decoder": _rounded(maps.decoder_self),
        "cross": _rounded(maps.cross),
    }


@torch.no_grad()
def classification_attention(classifier: Classifier, text: str) -> dict[str, Any]:
    """Encoder self-attention, and how much each token moves the predicted label's logit.

    With mean pooling the logit is exactly a sum over tokens, w_c · h_i / n + b_c, so token i
    weighs w_c · h_i / n; with a [CLS] token, the last layer's attention from [CLS] (mean of
    the heads) is shown instead.
    """
    model = classifier.model.eval()
    ids = encode_texts(classifier.tokenizer, [text], classifier.data)[0]
    if classifier.data.cls:
        ids = [CLS_ID, *ids]
    device = next(model.parameters()).device
    rows = torch.tensor([ids], device=device)  # (1, S)
    mask = padding_mask(rows, model.config.pad_id)  # (1, 1, 1, S)
    states, maps = model.encoder(rows, mask, need_weights=True)  # (1, S, D)
    logits = model.head(model.pool(states, mask))[0]  # (C,)
    label = int(logits.argmax())
    if model.config.pooling == "cls":
        weights = maps[-1][0, :, 0].mean(0)  # (S,)
        kind = "attention from [CLS], last layer, mean of heads"
    else:
        weights = states[0] @ model.head.weight[label] / len(ids)  # (S,)
        kind = "contribution to the predicted label's logit"
    return {
        "tokens": classifier.tokenizer.tokens_from_ids(ids),
        "encoder": _rounded(maps),
        "token_weights": torch.round(weights.double(), decimals=DIGITS).tolist(),
        "token_weights_meaning": kind,
        "label": classifier.labels[label],
    }
