"""The peers: existing PyTorch encoder-decoder Transformers, built to the benchmark's shape,
and CTranslate2 decoding qkv's exported model.

Each adapter exposes the same small interface as the qkv side (`qkv_side.py`):

    model                      the nn.Module
    meta                       a dict describing the implementation and its settings
    n_embedding_params()       token and learned position tables (lookups, not matmuls)
    optimizer(lr)              torch.optim.Adam, fused where torch has a fused kernel
    loss(src, tgt_in, labels)  mean label-smoothed cross-entropy over non-pad targets
    greedy(src, n)             (B, n) tokens, exactly n new tokens (no early stop)
    beam(src, n, k)            (B, n) best beam, exactly n new tokens (only where supported)

Every peer is set up as it runs best and as qkv is: attention dropout 0.0 (qkv's default and
Marian's own; dropout 0.1 elsewhere), Adam with `fused=True`. The peers are an optional extra
(`pip install -e .[bench]`); torch_nn needs only torch.

The CTranslate2 peers (`ct2_float32`, `ct2_int8`; `pip install -e .[deploy]`) decode only:
they have no `loss` (`trainable`), and their `model` is the qkv model they were exported from,
kept only so that the phases can move it and put it in eval mode as any system's;
`weights_dtype` says what their translators compute in.
"""

from __future__ import annotations

import importlib.util
import math
import os
import tempfile
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from workload import BOS, EOS, PAD, Shape

LABEL_SMOOTHING = 0.1
PEERS = (
    "torch_nn",
    "hf_marian",
    "xtransformers",
    "xtransformers_flash",
    "ct2_float32",
    "ct2_int8",
)
REQUIRES = {
    "torch_nn": "torch",
    "hf_marian": "transformers",
    "xtransformers": "x_transformers",
    "xtransformers_flash": "x_transformers",
    "ct2_float32": "ctranslate2",
    "ct2_int8": "ctranslate2",
}
QKV_PEERS = ("ct2_float32", "ct2_int8")
"""Peers built from this tree's qkv (its model and exporter): their workers import this tree's
`qkv`, as the qkv system's do."""
ATTENTION_DROPOUT = 0.0
"""Dropout on the attention weights, for every peer: qkv's default, and Marian's."""
MARIAN_TOKENS: dict[str, Any] = {
    "pad_token_id": PAD,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "decoder_start_token_id": BOS,
    "forced_eos_token_id": None,
}
"""The special ids as `MarianConfig` and `GenerationConfig` take them: BOS starts the decoder,
as in qkv, and nothing forces EOS at the length limit."""


def marian_config(
    *,
    src_vocab: int,
    tgt_vocab: int,
    d_model: int,
    n_heads: int,
    d_ff: int,
    n_encoder_layers: int,
    n_decoder_layers: int,
    activation: str,
    dropout: float,
    max_positions: int,
    tied: bool,
    attention_dropout: float = ATTENTION_DROPOUT,
) -> Any:
    """A `MarianConfig` for a qkv-shaped model: the same heads and feed-forward width on both
    sides, `dropout` on residuals and activations, `attention_dropout` on the attention
    weights, embeddings scaled by sqrt(D), SDPA attention and qkv's special ids
    (`MARIAN_TOKENS`)."""
    from transformers import MarianConfig

    return MarianConfig(
        vocab_size=src_vocab,
        decoder_vocab_size=tgt_vocab,
        d_model=d_model,
        encoder_layers=n_encoder_layers,
        decoder_layers=n_decoder_layers,
        encoder_attention_heads=n_heads,
        decoder_attention_heads=n_heads,
        encoder_ffn_dim=d_ff,
        decoder_ffn_dim=d_ff,
        activation_function=activation,
        dropout=dropout,
        attention_dropout=attention_dropout,
        activation_dropout=dropout,
        max_position_embeddings=max_positions,
        scale_embedding=True,
        **MARIAN_TOKENS,
        share_encoder_decoder_embeddings=tied,
        tie_word_embeddings=tied,
        attn_implementation="sdpa",
    )


def available(name: str) -> bool:
    """Whether the package a peer needs is installed."""
    return importlib.util.find_spec(REQUIRES[name]) is not None


def sinusoids(length: int, d_model: int) -> Tensor:
    """(length, D) fixed sinusoidal positions."""
    position = torch.arange(length, dtype=torch.float32)[:, None]  # (L, 1)
    rate = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))  # (D/2,)
    table = torch.zeros(length, d_model)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate)
    return table


def padded_cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    """The peers' loss: logits (B, T, V) over every position, padding ignored."""
    return F.cross_entropy(
        logits.flatten(0, 1), labels.flatten(), ignore_index=PAD, label_smoothing=LABEL_SMOOTHING
    )


class Peer:
    """Shared defaults of the adapters."""

    name = "?"
    model: nn.Module
    meta: dict[str, Any]
    bf16_weights = True  # bf16 runs decode with the weights cast to bf16 (else: autocast)

    def optimizer(self, lr: float) -> torch.optim.Optimizer:
        return adam(self.model, lr)


def adam(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """Adam over the trainable parameters, `fused=True`: one kernel for all of them, on CPUs
    and CUDA GPUs (torch's default on a CPU is a loop over the parameters); `foreach` where
    torch has no fused kernel for the parameters' device."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    options: dict[str, Any] = {"lr": lr, "betas": (0.9, 0.98), "eps": 1e-9}
    try:
        return torch.optim.Adam(trainable, fused=True, **options)
    except RuntimeError:
        return torch.optim.Adam(trainable, foreach=True, **options)


class TorchNNSeq2Seq(nn.Module):
    """torch.nn.Transformer with embeddings x sqrt(D), sinusoidal positions and a generator."""

    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.src_emb = nn.Embedding(s.src_vocab, s.d_model, padding_idx=PAD)
        self.tgt_emb = nn.Embedding(s.tgt_vocab, s.d_model, padding_idx=PAD)
        self.register_buffer("positions", sinusoids(s.max_positions, s.d_model), persistent=False)
        self.dropout = nn.Dropout(s.dropout)
        self.transformer = nn.Transformer(
            d_model=s.d_model,
            nhead=s.n_heads,
            num_encoder_layers=s.n_encoder_layers,
            num_decoder_layers=s.n_decoder_layers,
            dim_feedforward=s.d_ff,
            dropout=s.dropout,
            batch_first=True,
        )  # post-norm, relu
        # nn.Transformer has one dropout for everything: the attention weights get qkv's
        for module in self.transformer.modules():
            if isinstance(module, nn.MultiheadAttention):
                module.dropout = ATTENTION_DROPOUT
        self.generator = nn.Linear(s.d_model, s.tgt_vocab)
        self.scale = math.sqrt(s.d_model)

    def embed(self, table: nn.Embedding, ids: Tensor) -> Tensor:
        return self.dropout(table(ids) * self.scale + self.positions[: ids.size(1)])

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        src_pad = src == PAD  # torch: True = ignore
        return self.transformer.encoder(
            self.embed(self.src_emb, src), src_key_padding_mask=src_pad
        ), src_pad

    def decode(self, memory: Tensor, src_pad: Tensor, tgt_in: Tensor) -> Tensor:
        length = tgt_in.size(1)
        future = torch.triu(torch.ones(length, length, dtype=torch.bool, device=tgt_in.device), 1)
        return self.transformer.decoder(
            self.embed(self.tgt_emb, tgt_in),
            memory,
            tgt_mask=future,
            tgt_key_padding_mask=tgt_in == PAD,
            memory_key_padding_mask=src_pad,
            tgt_is_causal=True,
        )

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        memory, src_pad = self.encode(src)
        return self.generator(self.decode(memory, src_pad, tgt_in))  # (B, T, V)


class TorchNNPeer(Peer):
    name = "torch_nn"

    def __init__(self, shape: Shape) -> None:
        self.model = TorchNNSeq2Seq(shape)
        self.meta = {
            "impl": "torch.nn.Transformer(batch_first=True), post-norm, own embeddings x sqrt(D), "
            "sinusoidal positions, nn.Linear generator",
            "attention": "nn.MultiheadAttention -> F.scaled_dot_product_attention; attention "
            f"dropout {ATTENTION_DROPOUT} (set on each nn.MultiheadAttention)",
            "kv_cache": "no (nn.TransformerDecoder has no incremental API: greedy re-decodes "
            "the prefix each step)",
        }

    def n_embedding_params(self) -> int:
        return self.model.src_emb.weight.numel() + self.model.tgt_emb.weight.numel()

    def loss(self, src: Tensor, tgt_in: Tensor, labels: Tensor) -> Tensor:
        return padded_cross_entropy(self.model(src, tgt_in), labels)

    def greedy(self, src: Tensor, n: int) -> Tensor:
        # The encoder's inference fast path fails under autocast (mixed dtypes): bf16 runs
        # take the regular path, as a user would have to.
        fastpath = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(
            fastpath and not torch.is_autocast_enabled(src.device.type)
        )
        try:
            memory, src_pad = self.model.encode(src)
        finally:
            torch.backends.mha.set_fastpath_enabled(fastpath)
        out = torch.full((src.size(0), 1), BOS, dtype=torch.long, device=src.device)
        for _ in range(n):
            states = self.model.decode(memory, src_pad, out)  # (B, t, D)
            logits = self.model.generator(states[:, -1])  # (B, V)
            logits[:, EOS] = -math.inf  # exactly n new tokens
            out = torch.cat([out, logits.argmax(-1, keepdim=True)], dim=1)
        return out[:, 1:]


class HFMarianPeer(Peer):
    name = "hf_marian"

    def __init__(self, shape: Shape) -> None:
        from transformers import GenerationConfig, MarianMTModel

        s = shape
        config = marian_config(
            src_vocab=s.src_vocab,
            tgt_vocab=s.tgt_vocab,
            d_model=s.d_model,
            n_heads=s.n_heads,
            d_ff=s.d_ff,
            n_encoder_layers=s.n_encoder_layers,
            n_decoder_layers=s.n_decoder_layers,
            activation="relu",
            dropout=s.dropout,
            max_positions=s.max_positions,
            tied=False,
        )
        self.model = MarianMTModel(config)
        self.generation_config = GenerationConfig
        self.meta = {
            "impl": "transformers.MarianMTModel(MarianConfig(...)), random init, post-norm, relu, "
            "untied",
            "attention": f"{self.model.config._attn_implementation}; attention dropout "
            f"{config.attention_dropout}",
            "kv_cache": "yes (generate: self-attention cache, cross K/V once)",
        }

    def n_embedding_params(self) -> int:
        inner = self.model.model
        n = inner.encoder.embed_tokens.weight.numel() + inner.decoder.embed_tokens.weight.numel()
        for table in (inner.encoder.embed_positions, inner.decoder.embed_positions):
            if table.weight.requires_grad:
                n += table.weight.numel()
        return n

    def loss(self, src: Tensor, tgt_in: Tensor, labels: Tensor) -> Tensor:
        logits = self.model(
            input_ids=src,
            attention_mask=src != PAD,
            decoder_input_ids=tgt_in,
            decoder_attention_mask=tgt_in != PAD,
            use_cache=False,  # training: no key/value cache to build
        ).logits
        return padded_cross_entropy(logits, labels)

    def _generate(self, src: Tensor, n: int, beams: int) -> Tensor:
        config = self.generation_config(
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            num_beams=beams,
            early_stopping=False,
            **MARIAN_TOKENS,
            use_cache=True,
        )
        out = self.model.generate(
            input_ids=src, attention_mask=src != PAD, generation_config=config
        )
        return out[:, 1:]

    def greedy(self, src: Tensor, n: int) -> Tensor:
        return self._generate(src, n, 1)

    def beam(self, src: Tensor, n: int, k: int) -> Tensor:
        return self._generate(src, n, k)


class XTransformersPeer(Peer):
    name = "xtransformers"
    bf16_weights = False  # it makes float32 activations of its own: bf16 decoding needs autocast

    def __init__(self, shape: Shape, flash: bool = False) -> None:
        from x_transformers import XTransformer

        s = shape
        sides: dict[str, Any] = {}
        for side, vocab, depth in (
            ("enc", s.src_vocab, s.n_encoder_layers),
            ("dec", s.tgt_vocab, s.n_decoder_layers),
        ):
            sides.update(
                {
                    f"{side}_num_tokens": vocab,
                    f"{side}_depth": depth,
                    f"{side}_heads": s.n_heads,
                    f"{side}_attn_dim_head": s.d_model // s.n_heads,
                    f"{side}_max_seq_len": s.max_positions,
                    f"{side}_ff_mult": s.d_ff / s.d_model,
                    f"{side}_ff_custom_activation": nn.ReLU(),
                    f"{side}_emb_dropout": s.dropout,
                    f"{side}_attn_dropout": ATTENTION_DROPOUT,
                    f"{side}_attn_sublayer_dropout": s.dropout,
                    f"{side}_ff_dropout": s.dropout,
                    f"{side}_ff_sublayer_dropout": s.dropout,
                    f"{side}_attn_flash": flash,
                }
            )
        self.model = XTransformer(
            dim=s.d_model, tie_token_emb=False, pad_value=PAD, ignore_index=PAD, **sides
        )
        self.meta = {
            "impl": "x_transformers.XTransformer, pre-norm, relu, learned absolute positions",
            "attention": (
                "F.scaled_dot_product_attention (attn_flash=True)"
                if flash
                else "hand-written einsum attention (attn_flash=False, the default)"
            )
            + f"; attention dropout {ATTENTION_DROPOUT}",
            "kv_cache": "yes (generate(cache_kv=True))",
        }

    def n_embedding_params(self) -> int:
        n = 0
        for wrapper in (self.model.encoder, self.model.decoder.net):
            n += wrapper.token_emb.emb.weight.numel()
            table = getattr(wrapper, "pos_emb", None)
            if hasattr(table, "emb"):
                n += table.emb.weight.numel()
        return n

    def loss(self, src: Tensor, tgt_in: Tensor, labels: Tensor) -> Tensor:
        src_mask = src != PAD
        memory = self.model.encoder(src, mask=src_mask, return_embeddings=True)
        logits = self.model.decoder.net(
            tgt_in, context=memory, context_mask=src_mask, mask=tgt_in != PAD
        )
        return padded_cross_entropy(logits, labels)

    def greedy(self, src: Tensor, n: int) -> Tensor:
        # x-transformers' generate has no end token unless one is given: exactly n tokens
        start = torch.full((src.size(0), 1), BOS, dtype=torch.long, device=src.device)
        return self.model.generate(src, start, n, mask=src != PAD, temperature=0.0, cache_kv=True)


class XTransformersFlashPeer(XTransformersPeer):
    """x-transformers with `attn_flash=True`, its README's way to SDPA's fused kernels."""

    name = "xtransformers_flash"

    def __init__(self, shape: Shape) -> None:
        super().__init__(shape, flash=True)


def ct2_vocabulary(size: int) -> list[str]:
    """Token strings for the ids 0..size-1: qkv's special tokens at the benchmark's special ids
    (PAD, BOS, EOS, then "<unk>", which CTranslate2 needs), a word string for every other id."""
    from qkv.data import special

    assert (PAD, BOS, EOS) == (special.PAD_ID, special.BOS_ID, special.EOS_ID)
    first = special.UNK_ID + 1
    return [*special.SPECIAL_TOKENS[:first], *(f"w{i}" for i in range(first, size))]


class CTranslate2Peer(Peer):
    """qkv's model of the benchmark's shape, exported by qkv's own exporter
    (`qkv.export.ctranslate2.transformer_spec`, what `qkv export` runs) and decoded by a
    `ctranslate2.Translator`. Decoding only.

    Two translators of the same export, one per thread layout of the decoding phase: "split"
    (`split` replicas of `threads / split` threads: CTranslate2 releases the GIL, so that as
    many Python threads decode as many batches at once) and "one" (one replica on all the
    threads). A call takes "split" when its thread runs fewer torch threads than the phase
    (a worker thread of `phases.map_split`), "one" otherwise.
    """

    name = "ct2_float32"
    quantization: str | None = None
    # its weights are CTranslate2's, as exported: the torch model is never cast or used
    bf16_weights = False

    def __init__(
        self, shape: Shape, device: str = "cpu", split: int = 1, model: nn.Module | None = None
    ) -> None:
        """`model`: a qkv model of `shape` to export (tests); by default a new one, seeded by
        the phase as every system is."""
        import ctranslate2
        from qkv_side import model_config

        import qkv
        from qkv.export.ctranslate2 import transformer_spec
        from qkv.model import Seq2SeqTransformer

        self.model = (model or Seq2SeqTransformer(model_config(shape))).eval()
        self.source = ct2_vocabulary(shape.src_vocab)
        target = ct2_vocabulary(shape.tgt_vocab)
        self.index = {token: i for i, token in enumerate(target)}
        self.threads = torch.get_num_threads()
        layouts = {"one": (1, self.threads)}
        if split > 1:
            layouts["split"] = (split, max(1, self.threads // split))
        self.translators: dict[str, Any] = {}
        with tempfile.TemporaryDirectory() as folder:
            spec = transformer_spec(self.model, self.source, target)
            spec.validate()
            spec.optimize(quantization=self.quantization)
            spec.save(folder)
            del spec
            for way, (inter, intra) in layouts.items():
                self.translators[way] = ctranslate2.Translator(
                    folder, device=device, inter_threads=inter, intra_threads=intra
                )
        # A Translator sets its intra_threads as the calling thread's OpenMP threads, which
        # torch shares: the phase's count is given back.
        torch.set_num_threads(self.threads)
        compute = self.translators["one"].compute_type
        self.weights_dtype = f"ctranslate2 {compute}"
        self.meta = {
            "impl": f"ctranslate2 {ctranslate2.__version__} Translator on qkv's "
            "Seq2SeqTransformer (post-norm, relu, sinusoidal positions, separate vocabularies) "
            "exported by qkv.export.ctranslate2.transformer_spec, quantization "
            f"{self.quantization or 'none'}, compute type {compute}, on {device}",
            "attention": "CTranslate2's own multi-head attention (C++)",
            "kv_cache": "yes (CTranslate2's decoder state: self-attention cache, cross K/V once)",
            "threads": "; ".join(
                f"{way}: Translator(inter_threads={inter}, intra_threads={intra})"
                for way, (inter, intra) in layouts.items()
            ),
            "export": f"qkv package {os.path.dirname(os.path.realpath(qkv.__file__))}",
        }

    def layout(self) -> str:
        """The translator for the calling thread: "split" in a worker thread of a share of the
        torch threads, "one" on all of them."""
        if "split" in self.translators and torch.get_num_threads() < self.threads:
            return "split"
        return "one"

    def _translate(self, src: Tensor, n: int, k: int) -> Tensor:
        """Exactly n new tokens per source (EOS only at n, and left out), the best of k."""
        tokens = [[self.source[i] for i in row if i != PAD] for row in src.tolist()]
        results = self.translators[self.layout()].translate_batch(
            tokens,
            beam_size=k,
            num_hypotheses=1,
            min_decoding_length=n,
            max_decoding_length=n,
            return_end_token=False,
            max_input_length=0,
        )
        found = [[self.index[t] for t in r.hypotheses[0]] for r in results]
        return torch.tensor(found, dtype=torch.long)

    def greedy(self, src: Tensor, n: int) -> Tensor:
        return self._translate(src, n, 1)

    def beam(self, src: Tensor, n: int, k: int) -> Tensor:
        return self._translate(src, n, k)


class CTranslate2Int8Peer(CTranslate2Peer):
    """The same export quantized to int8 (`spec.optimize(quantization="int8")`)."""

    name = "ct2_int8"
    quantization = "int8"


BUILDERS: dict[str, type[Peer]] = {
    "torch_nn": TorchNNPeer,
    "hf_marian": HFMarianPeer,
    "xtransformers": XTransformersPeer,
    "xtransformers_flash": XTransformersFlashPeer,
    "ct2_float32": CTranslate2Peer,
    "ct2_int8": CTranslate2Int8Peer,
}


def trainable(name: str) -> bool:
    """Whether a peer trains (has a `loss`); the others decode only."""
    return hasattr(BUILDERS[name], "loss")


def build_peer(name: str, shape: Shape, device: str = "cpu", split: int = 1) -> Peer:
    """Peer `name` of `shape`. The CTranslate2 peers are made on `device`, with a translator
    for `split` batches at once besides the one for one batch at a time."""
    if name not in BUILDERS:
        raise SystemExit(f"unknown peer {name!r}; known: {', '.join(BUILDERS)}")
    if issubclass(BUILDERS[name], CTranslate2Peer):
        return BUILDERS[name](shape, device=device, split=split)
    return BUILDERS[name](shape)
