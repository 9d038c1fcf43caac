"""Translation: parallel text in, a trained run directory out."""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from qkv import fast
from qkv.data.batching import (
    bucket_inputs,
    collate_pairs,
    pair_lengths,
    token_budget_arrays,
    token_budget_batches,
)
from qkv.data.cache import (
    CACHE_FILE,
    TokenCache,
    TokenCacheWriter,
    check_same_data,
    open_token_cache,
    text_digest,
)
from qkv.data.readers import find_split, read_parallel
from qkv.data.special import PAD_ID
from qkv.data.streaming import ParallelFiles, tokenize_pairs
from qkv.data.token_array import TokenArray, id_lists, token_array
from qkv.data.tokenizer import Tokenizer, check_vocabulary, size_note
from qkv.errors import ConfigError, DataError
from qkv.evaluation.bleu import score_translations
from qkv.inference.translate import DecodeOptions, translate_ids
from qkv.model.config import MAX_POSITIONS, ModelConfig
from qkv.model.seq2seq import Seq2SeqTransformer
from qkv.run import TOKENIZER_FILE, RunConfig, build_model, data_settings, load_tokenizer
from qkv.training.config import TrainConfig
from qkv.training.distributed import check_same_settings, is_main, main_first
from qkv.training.losses import bucket_loss, nonpad_logits, smoothed_cross_entropy
from qkv.training.plan import planned
from qkv.training.speed import pick_device, set_up_process
from qkv.training.trainer import Progress, Trainer
from qkv.viz.curves import write_curves


@dataclass
class TranslationData:
    """Where the parallel text is and how to turn it into tokens."""

    data_dir: str = ""  # holds train.{src,tgt}[.gz] and val (or valid, dev).{src,tgt}[.gz]
    src: str = "de"  # source language suffix
    tgt: str = "en"  # target language suffix
    vocab_size: int = 8000  # joint BPE vocabulary size
    min_frequency: int = 2  # BPE merges need this many occurrences
    lowercase: bool = False  # lowercase before BPE (output is then lowercase too)
    max_len: int = 128  # training pairs longer than this (tokens) are skipped
    valid_sentences: int = 0  # cap on validation sentences decoded for BLEU; 0 = all
    tokenizer_sample: int = 0  # BPE learnt from at most this many pairs, evenly spread; 0 = all

    def __post_init__(self) -> None:
        """Raises ConfigError for a setting out of range."""
        for name in ("valid_sentences", "tokenizer_sample"):
            if (value := getattr(self, name)) < 0:
                raise ConfigError(f"{name} must be >= 0 (0 = all), got {value}")
        if not 1 <= self.max_len <= MAX_POSITIONS:
            raise ConfigError(f"max_len must be between 1 and {MAX_POSITIONS}, got {self.max_len}")
        check_vocabulary(self.vocab_size, self.min_frequency)


class TranslationTask:
    """Batches, loss and validation (loss, greedy BLEU, chrF) of a translation model."""

    metric = "bleu"

    def __init__(
        self,
        model: Seq2SeqTransformer,
        tokenizer: Tokenizer,
        corpora: Mapping[str, TokenArray | Sequence[Sequence[int]]],
        valid_refs: list[str],
        train: TrainConfig,
    ) -> None:
        """`corpora` holds "train.src", "train.tgt" (read from the token cache as batches
        need them), "valid.src" and "valid.tgt" (held in memory)."""
        self.model, self.tokenizer, self.train_config = model, tokenizer, train
        self.src, self.tgt = token_array(corpora["train.src"]), token_array(corpora["train.tgt"])
        self.valid_src, self.valid_tgt = _fit_validation(
            id_lists(corpora["valid.src"]), id_lists(corpora["valid.tgt"]), model.config.max_len
        )
        self.valid_refs = valid_refs
        self.label_smoothing = train.label_smoothing
        self.target_lengths = self.tgt.lengths  # (n,)
        self.lengths = padded_lengths(self.src, self.tgt)  # (n,)
        self.trivial = 1.0  # validation BLEU at or below it: nothing learned

    def batches(self, epoch: int) -> list[np.ndarray]:
        c = self.train_config
        return token_budget_arrays(
            self.lengths, c.max_tokens, shuffle=True, seed=c.seed, epoch=epoch
        )

    def n_targets(self, batch: Sequence[int] | np.ndarray) -> int:
        return int(self.target_lengths[np.asarray(batch)].sum()) + len(batch)

    def loss(
        self, batch: Sequence[int] | np.ndarray, device: torch.device
    ) -> tuple[torch.Tensor, dict[str, float]]:
        pairs = collate_pairs(self.src.rows(batch), self.tgt.rows(batch)).to(device)
        states = self.model.hidden(pairs.src, pairs.tgt_in)  # (B, T, D)
        logits, labels = nonpad_logits(self.model.output, states, pairs.labels, PAD_ID)
        loss = smoothed_cross_entropy(logits, labels, self.label_smoothing, PAD_ID)
        return loss, {}

    def padded_inputs(
        self, batch: Sequence[int] | np.ndarray, device: torch.device
    ) -> dict[str, torch.Tensor]:
        pairs = collate_pairs(self.src.rows(batch), self.tgt.rows(batch))
        return {name: tensor.to(device) for name, tensor in bucket_inputs(pairs).items()}

    def padded_loss(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return bucket_loss(self.model, inputs, self.label_smoothing, PAD_ID)

    def evaluate(self, device: torch.device) -> dict[str, float]:
        total, count = 0.0, 0
        scored = [i for i, ids in enumerate(self.valid_src) if ids]  # a loss needs a source
        src, tgt = [self.valid_src[i] for i in scored], [self.valid_tgt[i] for i in scored]
        lengths, budget = pair_lengths(src, tgt), self.train_config.max_tokens
        for batch in token_budget_batches(lengths, budget, shuffle=False, seed=0, epoch=0):
            pairs = collate_pairs([src[i] for i in batch], [tgt[i] for i in batch]).to(device)
            states = self.model.hidden(pairs.src, pairs.tgt_in)
            logits, labels = nonpad_logits(self.model.output, states, pairs.labels, PAD_ID)
            total += float(smoothed_cross_entropy(logits, labels, 0.0, PAD_ID))
            count += int((labels != PAD_ID).sum())
        found = translate_ids(self.model, self.valid_src, DecodeOptions(), device)
        scores = score_translations(self.tokenizer.decode_batch(found), self.valid_refs)
        return {
            "loss": total / max(count, 1),
            "bleu": scores.bleu,
            "chrf": scores.chrf,
            "bleu_lowercase": scores.bleu_lowercase,
        }


def _fit_validation(
    src: list[list[int]], tgt: list[list[int]], max_len: int
) -> tuple[list[list[int]], list[list[int]]]:
    """Validation pairs cut to what a model of `max_len` positions reads: max_len source
    tokens, max_len - 1 target tokens (plus BOS or EOS). BLEU still uses whole references."""
    long = sum(len(s) > max_len or len(t) >= max_len for s, t in zip(src, tgt, strict=True))
    if long:
        print(
            f"warning: cutting {long} validation pair(s) longer than the model's {max_len} "
            "positions: the loss reads what fits, and BLEU scores the cut source's "
            "translation against the whole reference"
        )
    return [s[:max_len] for s in src], [t[: max_len - 1] for t in tgt]


def prepare(
    data: TranslationData, run_dir: Path, tokenizer: Tokenizer | None, model_max_len: int
) -> tuple[Tokenizer, dict[str, TokenArray], list[str]]:
    """Reads the text, trains the tokenizer (unless given), tokenizes once into the run's
    token cache (the training text streamed, never whole in memory); training pairs longer
    than `data.max_len` or `model_max_len` are skipped. A resumed run (`tokenizer` given)
    must find the text its cache holds, and rebuilds a cache that is not whole."""
    paths = {
        f"{split}.{side}": find_split(data.data_dir, name, language)
        for split, name in (("train", "train"), ("valid", "val"))
        for side, language in (("src", data.src), ("tgt", data.tgt))
    }
    train = ParallelFiles.counted(paths["train.src"], paths["train.tgt"])
    valid_src, valid_tgt = read_parallel(paths["valid.src"], paths["valid.tgt"])
    digests = {"valid.src": text_digest(valid_src), "valid.tgt": text_digest(valid_tgt)}
    cache_path = run_dir / CACHE_FILE
    cache = None  # a cache found in a new run's directory was not made with its tokenizer
    if tokenizer is not None:
        digests["train.src"], digests["train.tgt"] = train.digests()
        check_same_data(cache_path, {name: (paths[name], digests[name]) for name in digests})
        cache = open_token_cache(cache_path)
    if data.valid_sentences:
        valid_src, valid_tgt = valid_src[: data.valid_sentences], valid_tgt[: data.valid_sentences]
    if tokenizer is None:
        texts = train.texts(data.tokenizer_sample)
        reading = tqdm(texts, desc="learning BPE", unit="line", disable=None, leave=False)
        tokenizer = Tokenizer.train(reading, data.vocab_size, data.min_frequency, data.lowercase)
        if note := size_note(tokenizer, data.vocab_size):
            print(note)
        tokenizer.save(run_dir / TOKENIZER_FILE)
    if cache is None:
        limit = min(data.max_len, model_max_len)
        cache = _build_cache(tokenizer, train, (valid_src, valid_tgt), digests, cache_path, limit)
    return tokenizer, cache.arrays, valid_tgt


def _build_cache(
    tokenizer: Tokenizer,
    train: ParallelFiles,
    valid: tuple[list[str], list[str]],
    digests: dict[str, str],
    path: Path,
    limit: int,
) -> TokenCache:
    """Tokenizes the training pairs (streamed; those of `limit` tokens or more skipped) and
    the validation pairs into a new token cache at `path`."""
    with TokenCacheWriter(path) as writer:
        done = tokenize_pairs(tokenizer, train, writer, ("train.src", "train.tgt"), limit)
        if not done.kept:
            raise DataError(
                train.src,
                f"no training pair is left: all {done.read} are longer than max_len "
                f"({limit} tokens)",
            )
        if done.kept < done.read:
            print(f"skipping {done.read - done.kept} training pairs longer than {limit} tokens")
        writer.add("valid.src", tokenizer.encode_batch(valid[0]))
        writer.add("valid.tgt", tokenizer.encode_batch(valid[1]))
        if (done.src_digest, done.tgt_digest) == (digests["valid.src"], digests["valid.tgt"]):
            print(
                "warning: the validation files hold the training pairs: validation measures "
                "what the model learned by heart"
            )
        digests = {**digests, "train.src": done.src_digest, "train.tgt": done.tgt_digest}
        return writer.finish(digests)


def padded_lengths(src: TokenArray, tgt: TokenArray) -> np.ndarray:
    """(n,) padded lengths of the pairs, as `pair_lengths` gives them."""
    return np.maximum(src.lengths, tgt.lengths) + 1


def train_translation(
    data: TranslationData | None,
    model_config: ModelConfig | None,
    train_config: TrainConfig | None,
    run_dir: Path,
    resume: RunConfig | None = None,
    explicit: frozenset[str] = frozenset(),
) -> Progress:
    """Trains a translation model into `run_dir`, or continues the run `resume` (its
    configuration, with changes saved once the data checks out). A new run's schedule is
    planned from the data's size (`qkv.training.plan`), but for the settings in `explicit`."""
    if resume:
        data = data_settings(TranslationData, resume.data, run_dir)
        model_config, train_config = resume.model, resume.train
        tokenizer: Tokenizer | None = load_tokenizer(run_dir)
    else:
        assert data is not None and model_config is not None and train_config is not None
        tokenizer = None
        # Absolute, so that `--resume` finds it from any working directory.
        data.data_dir = os.path.abspath(data.data_dir) if data.data_dir else ""
        # Positions for the longest pair kept (`max_len` is the data's limit).
        model_config = replace(model_config, max_len=max(model_config.max_len, data.max_len))
        if model_config.n_decoder_layers < 1:  # refused before any work
            raise ConfigError("translation needs a decoder: n_decoder_layers must be 1 or more")
    device = pick_device(train_config.device)  # before any work: a missing GPU fails first
    run_dir.mkdir(parents=True, exist_ok=True)
    set_up_process(train_config)
    check_same_settings(model_config, train_config, data)  # under torchrun
    with main_first():  # rank 0 trains the tokenizer and caches the tokens; the others read them
        if tokenizer is None and not is_main():
            tokenizer = load_tokenizer(run_dir)
        tokenizer, corpora, valid_refs = prepare(data, run_dir, tokenizer, model_config.max_len)
    if not resume:
        model_config = replace(model_config, vocab_size=tokenizer.vocab_size, tgt_vocab_size=None)
    random.seed(train_config.seed)
    torch.manual_seed(train_config.seed)
    model = build_model(Seq2SeqTransformer, model_config)  # before the run is saved
    if train_config.fast:
        fast.apply(model)
    plan = ""
    if not resume:
        train_config, plan = planned(
            train_config, padded_lengths(corpora["train.src"], corpora["train.tgt"]), explicit
        )
    if not resume:
        RunConfig("translation", model_config, train_config, asdict(data)).save(run_dir)
    task = TranslationTask(model, tokenizer, corpora, valid_refs, train_config)
    trainer = Trainer(task, train_config, run_dir, device)
    trainer.plan = plan
    if resume:
        trainer.resume()
        resume.save(run_dir)  # the new settings, once the run resumes
    progress = trainer.train()
    if is_main():
        write_curves(run_dir)
    return progress
