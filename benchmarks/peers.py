"""The peers: existing PyTorch encoder-decoder Transformers, built to the benchmark's shape.

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
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from workload import BOS, EOS, PAD, Shape

LABEL_SMOOTHING = 0.1
PEERS = ("torch_nn", "hf_marian", "xtransformers", "xtransformers_flash")
REQUIRES = {
    "torch_nn": "torch",
    "hf_marian": "transformers",
    "xtransformers": "x_transformers",
    "xtransformers_flash": "x_transformers",
}
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


def build_peer(name: str, shape: Shape) -> Peer:
    builders: dict[str, type[Peer]] = {
        "torch_nn": TorchNNPeer,
        "hf_marian": HFMarianPeer,
        "xtransformers": XTransformersPeer,
        "xtransformers_flash": XTransformersFlashPeer,
    }
    if name not in builders:
        raise SystemExit(f"unknown peer {name!r}; known: {', '.join(builders)}")
    return builders[name](shape)
