"""Translate text with a trained run: `Translator.load(run_dir).translate(sentences)`."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from qkv import fast
from qkv.data.readers import is_blank, texts_list
from qkv.data.tokenizer import Tokenizer
from qkv.errors import CheckpointError, ConfigError
from qkv.inference.incremental import DecodingWeights
from qkv.inference.translate import (
    DecodeOptions,
    Found,
    Progress,
    check_start,
    translate_hypotheses,
)
from qkv.model.seq2seq import Seq2SeqTransformer
from qkv.run import RunConfig, load_run_weights, load_tokenizer
from qkv.training.speed import pick_device

ENGINES = ("torch", "ctranslate2")


@dataclass
class Hypothesis:
    """One translation: its text, score (see `translate_hypotheses`), tokens and ids."""

    text: str
    score: float
    tokens: list[str]
    ids: list[int]


class Engine(Protocol):
    replicas: int  # calls it decodes side by side

    def translate_hypotheses(
        self, sources: list[list[int]], options: DecodeOptions, n_best: int
    ) -> list[list[Found]]: ...


class Translator:
    """A trained translation model with its tokenizer, decoding with PyTorch or, when loaded
    with `engine="ctranslate2"`, with the run's CTranslate2 export. Its decoder is frozen for
    decoding at the first translation and kept (frozen again if the model moves to another
    dtype or device): after changing the model's weights, make a new `Translator`."""

    def __init__(
        self,
        model: Seq2SeqTransformer,
        tokenizer: Tokenizer,
        device: torch.device | str,
        engine: Engine | None = None,
    ):
        self.device = torch.device(device)  # a name ("cpu") too
        self.model, self.tokenizer = model.eval().to(self.device), tokenizer
        self.engine = engine
        self.weights = DecodingWeights(self.model)

    def __getstate__(self) -> dict[str, object]:
        """What a copy or a pickle keeps (for a process pool, say): all but the frozen decoder,
        made again at the first translation. The CTranslate2 engine cannot be pickled."""
        if self.engine is not None:
            raise TypeError(
                "a Translator with engine='ctranslate2' cannot be copied or pickled; load one "
                "in each process with Translator.load(run_dir, engine='ctranslate2')"
            )
        return {name: value for name, value in vars(self).items() if name != "weights"}

    def __setstate__(self, state: dict[str, object]) -> None:
        vars(self).update(state)
        self.weights = DecodingWeights(self.model)

    @classmethod
    def load(
        cls,
        run_dir: str | Path,
        device: str = "auto",
        engine: str = "torch",
        quantize: str | None = None,
    ) -> Translator:
        """Load a run directory written by `qkv train translation`. With
        `engine="ctranslate2"` (`pip install 'qkv[deploy]'`) it decodes with the run's
        CTranslate2 export, made on first use (`quantize`: int8, int8_float32, bfloat16,
        float16) and again when the weights change."""
        if engine not in ENGINES:
            raise ConfigError(f"unknown engine {engine!r}: use {' or '.join(ENGINES)}")
        if quantize is not None and engine != "ctranslate2":
            raise ConfigError("--quantize is for --engine ctranslate2")
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
        placed = pick_device(device)
        if engine == "torch":
            return cls(model, tokenizer, placed)
        from qkv.export.ctranslate2 import vocabulary
        from qkv.export.engine import CTranslate2Engine, cached_export

        exported = CTranslate2Engine(
            cached_export(run_dir, quantize), vocabulary(tokenizer), placed
        )
        return cls(model, tokenizer, placed, exported)

    def encode(self, sentences: list[str], stacklevel: int = 2, start: int = 0) -> list[list[int]]:
        """Token ids, truncated to what the model's positions allow, with a warning from the
        line `stacklevel` frames up (the caller's by default) that numbers the sentences from
        `start` + 1."""
        limit = self.model.config.max_len - 1
        ids = self.tokenizer.encode_batch(texts_list(sentences, "sentences"))
        long = [i for i, s in enumerate(ids) if len(s) > limit]
        if long:
            warnings.warn(
                f"{len(long)} sentence(s) longer than {limit} tokens were truncated "
                f"(first: #{start + long[0] + 1})",
                stacklevel=stacklevel,
            )
        return [s[:limit] for s in ids]

    def translate(
        self,
        sentences: list[str],
        beam_size: int | None = None,
        progress: Progress = False,
        start: int = 0,
        **options: float | int | bool,
    ) -> list[str]:
        """Translate sentences; options are `DecodeOptions` fields (alpha, max_len_a, ...).
        The beam is 5 wide unless `sampling=True`, which decodes one line a sentence.

        Blank sentences translate to empty strings; `progress` draws a bar on stderr if it is a
        terminal (or is a function told how many sentences are done). `start`: the place of
        `sentences[0]` in an input translated in parts, which then samples as it would whole.
        Raises TypeError unless `sentences` is a list of strings.
        """
        found = self._hypotheses(sentences, beam_size, 1, progress, False, start, options)
        return [hypotheses[0].text for hypotheses in found]

    def hypotheses(
        self,
        sentences: list[str],
        beam_size: int | None = None,
        n_best: int = 1,
        progress: Progress = False,
        scored: bool = True,
        start: int = 0,
        **options: float | int | bool,
    ) -> list[list[Hypothesis]]:
        """The `n_best` best translations of each sentence, best first, with their scores:
        log-probability over the GNMT length penalty for beam search, log-probability for
        greedy and sampled outputs (NaN when not `scored`). `n_best` is at most `beam_size`;
        a blank sentence has one, the empty translation, scored 0. `progress` and `start`: as
        `translate` takes them."""
        return self._hypotheses(sentences, beam_size, n_best, progress, scored, start, options)

    def _hypotheses(
        self,
        sentences: list[str],
        beam_size: int | None,
        n_best: int,
        progress: Progress,
        scored: bool,
        start: int,
        options: dict[str, float | int | bool],
    ) -> list[list[Hypothesis]]:
        sentences = texts_list(sentences, "sentences")
        check_start(start)  # before any work, for either engine (CTranslate2 has no use for it)
        if unknown := [name for name in options if name not in DecodeOptions.__dataclass_fields__]:
            raise TypeError(_unknown_option(unknown[0]))
        if beam_size is not None or not options.get("sampling"):
            options["beam_size"] = 5 if beam_size is None else beam_size
        decode = DecodeOptions(**options)  # type: ignore[arg-type]
        texts = ["" if is_blank(s) else s for s in sentences]
        # Warnings name the line that called `translate` or `hypotheses`, 4 frames up.
        sources = self.encode(texts, stacklevel=4, start=start)
        if self.engine is not None:
            found = self.engine.translate_hypotheses(sources, decode, n_best)
            if callable(progress):
                progress(len(sources))
        else:
            found = translate_hypotheses(
                self.model,
                sources,
                decode,
                self.device,
                n_best,
                progress,
                scored,
                self.weights,
                start,
            )
        return [
            [
                Hypothesis(
                    self.tokenizer.decode(ids), score, self.tokenizer.tokens_from_ids(ids), ids
                )
                for ids, score in hypotheses
            ]
            for hypotheses in found
        ]


def _unknown_option(name: str) -> str:
    """The message for a keyword that is no `DecodeOptions` field, naming its method if any."""
    known = ", ".join(DecodeOptions.__dataclass_fields__)
    methods = {"n_best": "hypotheses()"} | dict.fromkeys(("device", "engine", "quantize"), "load()")
    method = f"; {name} is a keyword of Translator.{methods[name]}" if name in methods else ""
    return f"unknown option {name!r} (options: {known}){method}"
