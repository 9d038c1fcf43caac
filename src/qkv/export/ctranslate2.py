"""Export a translation run to CTranslate2, with CTranslate2's own spec and converter API.

The exported model decodes the same way as qkv's PyTorch engine: the same vocabulary (token
strings in id order), no BOS or EOS on the source, BOS starts the target, EOS ends it,
embeddings scaled by sqrt(d_model), and the model's own position table (CTranslate2's built-in
sinusoids lay sine and cosine out in halves, qkv interleaves them).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from qkv import __version__
from qkv.data.special import BOS, EOS, UNK
from qkv.data.tokenizer import Tokenizer
from qkv.errors import ConfigError, QkvError
from qkv.export import QUANTIZATIONS
from qkv.model.seq2seq import Seq2SeqTransformer
from qkv.run import TOKENIZER_FILE, WEIGHTS_FILE, RunConfig, load_run_weights, load_tokenizer
from qkv.training.checkpoint import UMASK, sha256

NOTE_FILE = "qkv_export.json"


def import_ctranslate2() -> Any:
    """The `ctranslate2` module, or a one-line error saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise QkvError(
            "the ctranslate2 engine needs the deploy extra: pip install 'qkv[deploy]'"
        ) from None
    return ctranslate2


def weights_digest(run_dir: Path) -> str:
    """sha256 of the run's best weights: an export is redone when they change."""
    return sha256(run_dir / WEIGHTS_FILE)


def export_run(run_dir: Path, out_dir: Path, quantize: str | None = None) -> Path:
    """Convert the translation run in `run_dir` into a CTranslate2 model directory `out_dir`.

    Written next to `out_dir` first and renamed into place, so an interrupted export leaves
    nothing half-written. An existing `out_dir` is replaced only if it is empty or holds an
    export, which stays until the new one takes its place.
    """
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ConfigError(f"--quantize must be one of {', '.join(QUANTIZATIONS)}, got {quantize!r}")
    ct2 = import_ctranslate2()
    config = RunConfig.load(run_dir)
    if config.task != "translation":
        raise ConfigError(f"{run_dir}: a {config.task} run; only translation runs export")
    given, out_dir = out_dir, out_dir.resolve()  # a link's target; "." beside its parent
    if out_dir == Path.cwd():
        raise ConfigError(f"{given} is the current directory; name it from its parent")
    empty = out_dir.is_dir() and not any(out_dir.iterdir())
    if out_dir.exists() and not empty and not (out_dir / NOTE_FILE).is_file():
        raise ConfigError(f"{given} exists and is not a qkv export; choose another directory")
    model = Seq2SeqTransformer(config.model)
    load_run_weights(model, run_dir)
    vocabulary = _vocabulary(run_dir, config.model.vocab_size)
    spec = transformer_spec(model.eval(), vocabulary)
    spec.validate()
    spec.optimize(quantization=quantize)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    old = tmp.with_name(tmp.name + ".old")
    try:
        spec.save(str(tmp))
        shutil.copyfile(run_dir / TOKENIZER_FILE, tmp / TOKENIZER_FILE)  # all a deployment needs
        kept = set(os.listdir(out_dir)) if out_dir.is_dir() else set()
        if others := sorted(kept - set(os.listdir(tmp)) - {NOTE_FILE}):
            raise ConfigError(
                f"{given} holds files an export does not write ({', '.join(others[:3])}): "
                "move them, or export to another directory"
            )
        note = {
            "qkv_version": __version__,
            "ctranslate2_version": ct2.__version__,
            "run": str(run_dir.resolve()),
            "weights_sha256": weights_digest(run_dir),
            "quantize": quantize,
            "max_len": config.model.max_len,
        }
        (tmp / NOTE_FILE).write_text(json.dumps(note, indent=2) + "\n")
        os.chmod(tmp, 0o777 & ~UMASK)  # as a directory is made, not mkdtemp's owner-only
        if out_dir.exists():
            os.replace(out_dir, old)
        try:
            os.replace(tmp, out_dir)
        except OSError:
            if old.exists():
                os.replace(old, out_dir)  # the export replaced, back in its place
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return given


def _vocabulary(run_dir: Path, vocab_size: int) -> list[str]:
    tokenizer = load_tokenizer(run_dir)
    if tokenizer.vocab_size != vocab_size:
        raise ConfigError(
            f"{run_dir}: tokenizer has {tokenizer.vocab_size} tokens, the model {vocab_size}"
        )
    return vocabulary(tokenizer)


def vocabulary(tokenizer: Tokenizer) -> list[str]:
    """The tokenizer's token strings in id order: CTranslate2's vocabulary of the model."""
    return [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]


def transformer_spec(
    model: Seq2SeqTransformer, vocabulary: list[str], target_vocabulary: list[str] | None = None
) -> Any:
    """A `ctranslate2.specs.TransformerSpec` holding `model`'s weights; `vocabulary` names the
    source token ids (and the target ones, unless the model has a `target_vocabulary`)."""
    from ctranslate2.specs import common_spec, transformer_spec

    c = model.config
    target_vocabulary = target_vocabulary or vocabulary
    if (len(vocabulary), len(target_vocabulary)) != (c.vocab_size, c.target_vocab_size):
        raise ConfigError(
            f"vocabularies of {len(vocabulary)} and {len(target_vocabulary)} tokens for a model "
            f"of {c.vocab_size} and {c.target_vocab_size}"
        )
    activation = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}
    spec = transformer_spec.TransformerSpec.from_config(
        (c.n_encoder_layers, c.n_decoder_layers),
        c.n_heads,
        pre_norm=c.norm_first,
        activation=activation[c.activation],
    )
    _set_embeddings(spec.encoder, spec.encoder.embeddings[0], model.encoder.embeddings)
    _set_embeddings(spec.decoder, spec.decoder.embeddings, model.decoder.embeddings)
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder.layers, strict=True):
        _set_encoder_layer(layer_spec, layer)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder.layers, strict=True):
        _set_decoder_layer(layer_spec, layer)
    if c.norm_first:
        _set_norm(spec.encoder.layer_norm, model.encoder.final_norm)
        _set_norm(spec.decoder.layer_norm, model.decoder.final_norm)
    _set_linear(spec.decoder.projection, model.output)
    spec.register_source_vocabulary(vocabulary)
    spec.register_target_vocabulary(target_vocabulary)
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = UNK, BOS, EOS
    spec.config.decoder_start_token = BOS
    spec.config.add_source_bos = spec.config.add_source_eos = False
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    spec.config.layer_norm_epsilon = norms[0].eps
    return spec


def _array(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to(torch.float32).cpu().numpy().copy()


def _set_embeddings(spec: Any, token_spec: Any, embeddings: Any) -> None:
    """Token table (scaled by sqrt(d_model) in CTranslate2 too) and the position table."""
    token_spec.weight = _array(embeddings.token.table.weight)
    spec.scale_embeddings = True
    positions = embeddings.positions.table  # a buffer (sinusoids) or an nn.Embedding (learned)
    weight = positions.weight if isinstance(positions, nn.Embedding) else positions
    spec.position_encodings.encodings = _array(weight)


def _set_encoder_layer(spec: Any, layer: Any) -> None:
    _set_attention(spec.self_attention, layer.self_attn, self_attention=True)
    _set_norm(spec.self_attention.layer_norm, layer.self_attn_norm)
    _set_ffn(spec.ffn, layer.ffn, layer.ffn_norm)


def _set_decoder_layer(spec: Any, layer: Any) -> None:
    _set_attention(spec.self_attention, layer.self_attn, self_attention=True)
    _set_norm(spec.self_attention.layer_norm, layer.self_attn_norm)
    _set_attention(spec.attention, layer.cross_attn, self_attention=False)
    _set_norm(spec.attention.layer_norm, layer.cross_attn_norm)
    _set_ffn(spec.ffn, layer.ffn, layer.ffn_norm)


def _set_attention(spec: Any, attention: Any, self_attention: bool) -> None:
    """qkv's `in_proj` stacks [q; k; v]: one projection for self-attention, q and [k; v] for
    cross-attention, as CTranslate2 lays them out."""
    weight, bias = attention.in_proj.weight, attention.in_proj.bias
    d = weight.size(1)
    if self_attention:
        spec.linear[0].weight, spec.linear[0].bias = _array(weight), _array(bias)
    else:
        spec.linear[0].weight, spec.linear[0].bias = _array(weight[:d]), _array(bias[:d])
        spec.linear[1].weight, spec.linear[1].bias = _array(weight[d:]), _array(bias[d:])
    _set_linear(spec.linear[-1], attention.out_proj)


def _set_ffn(spec: Any, ffn: Any, norm: Any) -> None:
    _set_norm(spec.layer_norm, norm)
    _set_linear(spec.linear_0, ffn.linear1)
    _set_linear(spec.linear_1, ffn.linear2)


def _set_norm(spec: Any, norm: Any) -> None:
    if not isinstance(norm, nn.LayerNorm):
        raise ConfigError(f"cannot export a {type(norm).__name__} as a layer norm")
    spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)


def _set_linear(spec: Any, linear: Any) -> None:
    spec.weight = _array(linear.weight)
    if linear.bias is not None:
        spec.bias = _array(linear.bias)
