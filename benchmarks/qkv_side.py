"""qkv seen through the same interface as the peers (see `peers.py`).

Training runs the step of qkv's own trainer: `model.hidden` -> `nonpad_logits` (the output
projection only on real target rows) -> `smoothed_cross_entropy`, AdamW (fused), with
`tune_allocator()` applied at start. On a GPU (unless `cuda_graphs` is False), the trainer's
step there: batches padded to bucket shapes (`bucket_inputs`), each shape's whole step
recorded once as a CUDA graph and replayed (`qkv.training.graphed.GraphedStep`).

Decoding runs what `qkv translate` runs, with EOS masked so that every sentence gets exactly
n tokens, like `min_new_tokens = max_new_tokens = n` in Hugging Face's `generate`: on a CPU
(or with `cuda_graphs` False), `greedy_search` and `beam_search` over `ModelDecoder`, the
model's KV-cached `decode_step` (greedy search takes its `step_argmax`); on a GPU,
`graphed_greedy_search` and `graphed_beam_search`, whose decoding step and search step are
recorded together as one CUDA graph and replayed. `map_batches` decodes many batches as
`qkv translate` does: on a CPU, greedy batches as many at once as the torch threads (up to 4),
each in a worker thread of one torch thread (`qkv.inference.workers`); beam search's one at a
time. The benchmark reports it as qkv's way as shipped; its like-for-like figures give every
system the same split (`phases.map_split`).

The interface the harness expects of this file is in `benchmarks/README.md`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor
from workload import EOS, PAD, Shape

from qkv import fast
from qkv.data.batching import (
    PairBatch,
    bucket_inputs,
    collate_pairs,
    pair_lengths,
    token_budget_batches,
)
from qkv.inference.beam import beam_search
from qkv.inference.graphed import StaticDecoder
from qkv.inference.incremental import DecodingWeights, ModelDecoder
from qkv.inference.search import greedy_search
from qkv.inference.workers import auto_workers, map_in_workers
from qkv.model import ModelConfig, Seq2SeqTransformer
from qkv.training.graphed import GraphedStep
from qkv.training.losses import bucket_loss, nonpad_logits, smoothed_cross_entropy
from qkv.training.optimizer import adamw
from qkv.training.speed import tune_allocator

LABEL_SMOOTHING = 0.1
BEAM_ALPHA = 0.6


class NoEndStaticDecoder(StaticDecoder):
    """EOS masked in the fixed-shape decoder's logits, inside the step that the graph records
    (the eager `ModelDecoder` takes it as `never`)."""

    def compute(self) -> Tensor:
        logits = super().compute()  # (R, V)
        logits[:, EOS] = -torch.inf
        return logits


def model_config(shape: Shape) -> ModelConfig:
    return ModelConfig(
        vocab_size=shape.src_vocab,
        tgt_vocab_size=shape.tgt_vocab,
        d_model=shape.d_model,
        n_heads=shape.n_heads,
        d_ff=shape.d_ff,
        n_encoder_layers=shape.n_encoder_layers,
        n_decoder_layers=shape.n_decoder_layers,
        dropout=shape.dropout,
        max_len=shape.max_positions,
    )


class QkvSystem:
    """qkv's Seq2SeqTransformer with its trainer's step and its search functions."""

    name = "qkv"

    def __init__(self, shape: Shape, cuda_graphs: bool = True) -> None:
        self.allocator_tuned = tune_allocator()
        self.cuda_graphs = cuda_graphs
        self._weights: DecodingWeights | None = None
        config = model_config(shape)
        self.model = fast.apply(Seq2SeqTransformer(config))  # as `qkv train` and `Translator`
        self.meta = {
            "impl": "qkv.model.Seq2SeqTransformer with qkv.fast applied, post-norm, relu, "
            "sinusoidal positions, untied (separate vocabularies)",
            "attention": "F.scaled_dot_product_attention; attention_dropout "
            f"{config.attention_dropout} (qkv default, as in the paper)",
            "kv_cache": "yes (preallocated self-attention cache, cross K/V once)",
            "cuda_graphs": "one replay per decoding and search step on a GPU"
            if cuda_graphs
            else "off (eager decoding)",
            "train_step": "hidden -> nonpad_logits -> smoothed_cross_entropy; "
            "AdamW (fused); tune_allocator "
            + ("applied" if self.allocator_tuned else "unavailable")
            + (
                "; on a GPU, padded to bucket shapes, one CUDA graph replay per step"
                if cuda_graphs
                else ""
            ),
        }

    def n_embedding_params(self) -> int:
        tables = {
            id(t.token.table.weight): t.token.table.weight.numel()
            for t in (self.model.encoder.embeddings, self.model.decoder.embeddings)
        }
        return sum(tables.values())

    def optimizer(self, lr: float) -> torch.optim.Optimizer:
        device = next(self.model.parameters()).device
        return adamw(self.model.parameters(), device, lr=lr, betas=(0.9, 0.98), eps=1e-9)

    def loss(self, src: Tensor, tgt_in: Tensor, labels: Tensor) -> Tensor:
        """Mean smoothed cross-entropy over the real target tokens (the trainer divides the
        summed loss by the number of targets, as here)."""
        states = self.model.hidden(src, tgt_in)  # (B, T, D)
        logits, kept = nonpad_logits(self.model.output, states, labels, PAD)  # (M', V), (M',)
        loss = smoothed_cross_entropy(logits, kept, LABEL_SMOOTHING, PAD)
        return loss / max(int((labels != PAD).sum()), 1)

    def graphed_step_function(
        self, lr: float, autocast_dtype: torch.dtype | None
    ) -> Callable[[dict[str, Tensor]], float] | None:
        """The trainer's GPU step: one CUDA graph replay per step (None without graphs)."""
        if not self.cuda_graphs:
            return None
        self.model.train()
        fast.apply(self.model, packed=False)  # fixed shapes, as the trainer's graphed step
        graphed = GraphedStep(
            self.model, self.optimizer(lr), self.padded_loss, math.inf, autocast_dtype
        )

        def step(batch: dict[str, Tensor]) -> float:
            pairs = PairBatch(**{k: v.cpu() for k, v in batch.items()})  # as the trainer's
            inputs = {k: v.to(batch["src"].device) for k, v in bucket_inputs(pairs).items()}
            loss_sum, _ = graphed.step(inputs, lr)
            return float(loss_sum) / max(pairs.n_target_tokens, 1)

        return step

    def padded_loss(self, inputs: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """`TranslationTask.padded_loss`: summed loss and target count of `bucket_inputs`."""
        return bucket_loss(self.model, inputs, LABEL_SMOOTHING, PAD)

    def greedy(self, src: Tensor, n: int) -> Tensor:
        """What `qkv translate` runs: on a GPU, each model step as a graph replay."""
        budget = torch.full((src.size(0),), n, dtype=torch.long, device=src.device)
        found = greedy_search(self.decoder(src, n, 1), src.size(0), budget)
        return torch.tensor(found, dtype=torch.long)  # (B, n)

    def map_batches(
        self, run: Callable[[Tensor], Tensor], batches: Sequence[Tensor], width: int
    ) -> list[Tensor]:
        """`run` over every batch as `qkv translate` decodes its batches (`workers=0`): on a
        CPU, greedy batches as many at once as the torch threads (up to 4), one worker thread
        each; beam search's (`width` > 1) one at a time."""
        workers = auto_workers(0, batches[0].device, width)
        return list(map_in_workers(lambda i: run(batches[i]), len(batches), workers))

    def beam(self, src: Tensor, n: int, k: int) -> Tensor:
        budget = torch.full((src.size(0),), n, dtype=torch.long, device=src.device)
        found = beam_search(self.decoder(src, n, k), src.size(0), k, budget, BEAM_ALPHA)
        return torch.tensor([hyps[0].tokens for hyps in found], dtype=torch.long)  # (B, n)

    @property
    def decoding_weights(self) -> DecodingWeights:
        """The frozen weights of the CPU's eager decoding, kept across batches as
        `translate_ids` keeps them across the batches of a call (made again for changed
        weights)."""
        if self._weights is None or self._weights.model is not self.model:
            self._weights = DecodingWeights(self.model)
        return self._weights

    def decoder(self, src: Tensor, n: int, width: int) -> NoEndStaticDecoder | ModelDecoder:
        """`make_decoder`'s choice, EOS never chosen: graph replays on a GPU, the frozen
        decoder on a CPU."""
        if self.cuda_graphs and src.is_cuda:
            return NoEndStaticDecoder(self.model, src, n, src.size(0) * width)
        return ModelDecoder(self.model, src, n, (EOS,), self.decoding_weights)


def bucketed_batches(batches: list[dict[str, np.ndarray]], seed: int) -> list[PairBatch]:
    """The same sentence pairs regrouped by qkv's own length-bucketed, token-budget batching.

    The budget (tokens of the longer side, padding included, per batch) is the mean unpadded
    size of the identical batches, so both kinds hold about as many target tokens per step.
    """
    sources, targets = [], []
    for batch in batches:
        for src, labels in zip(batch["src"], batch["labels"], strict=True):
            sources.append(src[src != PAD].tolist())
            targets.append(labels[labels != PAD].tolist()[:-1])  # collate_pairs adds the EOS
    lengths = pair_lengths(sources, targets)
    budget = round(sum(lengths) / len(batches))
    groups = token_budget_batches(lengths, budget, shuffle=True, seed=seed, epoch=0)
    return [collate_pairs([sources[i] for i in g], [targets[i] for i in g]) for g in groups]
