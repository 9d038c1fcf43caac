"""Translate text with a trained run: `Translator.load(run_dir).translate(sentences)`."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from qkv import fast
from qkv.data.readers import is_blank, texts_list
from qkv.data.tokenizer import Tokenizer
from qkv.errors import CheckpointError
from qkv.inference.translate import DecodeOptions, translate_ids
from qkv.model.seq2seq import Seq2SeqTransformer
from qkv.run import RunConfig, load_run_weights, load_tokenizer
from qkv.training.speed import pick_device


class Translator:
    """A trained translation model with its tokenizer."""

    def __init__(self, model: Seq2SeqTransformer, tokenizer: Tokenizer, device: torch.device):
        self.model, self.tokenizer, self.device = model.eval().to(device), tokenizer, device

    @classmethod
    def load(cls, run_dir: str | Path, device: str = "auto") -> Translator:
        """Load a run directory written by `qkv train translation`."""
        run_dir = Path(run_dir)
        config = RunConfig.load(run_dir)
        if config.task != "translation":
            raise CheckpointError(f"{run_dir}: a {config.task} run, not a translation run")
        tokenizer = load_tokenizer(run_dir)
        if tokenizer.vocab_size != config.model.vocab_size:
            raise CheckpointError(
                f"{run_dir}: tokenizer has {tokenizer.vocab_size} tokens, the model "
                f"{config.model.vocab_size}"
            )
        model = Seq2SeqTransformer(config.model)
        load_run_weights(model, run_dir)
        fast.apply(model)
        return cls(model, tokenizer, pick_device(device))

    def encode(self, sentences: list[str]) -> list[list[int]]:
        """Token ids, truncated (with a warning) to what the model's positions allow."""
        return self._encode(sentences)

    def _encode(self, sentences: list[str]) -> list[list[int]]:
        """`encode`, for `encode` and `translate` alike: its warning names their caller's line."""
        limit = self.model.config.max_len - 1
        ids = self.tokenizer.encode_batch(sentences)
        long = [i for i, s in enumerate(ids) if len(s) > limit]
        if long:
            warnings.warn(
                f"{len(long)} sentence(s) longer than {limit} tokens were truncated "
                f"(first: #{long[0] + 1})",
                stacklevel=3,
            )
        return [s[:limit] for s in ids]

    def translate(
        self,
        sentences: list[str],
        beam_size: int = 5,
        progress: bool = False,
        **options: float | int | bool,
    ) -> list[str]:
        """Translate sentences; options are `DecodeOptions` fields (alpha, max_len_a, ...).

        Blank sentences translate to empty strings; `progress` draws a bar on stderr if it is a
        terminal. Raises TypeError unless `sentences` is a list of strings.
        """
        sentences = texts_list(sentences, "sentences")
        decode = DecodeOptions(beam_size=beam_size, **options)  # type: ignore[arg-type]
        texts = ["" if is_blank(s) else s for s in sentences]
        found = translate_ids(self.model, self._encode(texts), decode, self.device, progress)
        return self.tokenizer.decode_batch(found)
