"""The runs a server holds, each behind a `Batcher`, and what they answer for one text."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from qkv.inference.classifier import Classifier
from qkv.inference.translate import SAMPLING_FIELDS
from qkv.inference.translator import Translator
from qkv.run import RunConfig
from qkv.serve.attention import classification_attention, translation_attention
from qkv.serve.batcher import Batcher
from qkv.serve.schema import ClassifyRequest, RequestError, TranslateRequest


@dataclass(frozen=True)
class TranslateOptions:
    """The options a batch of translations shares (hashable: the batcher compares them)."""

    beam: int
    alpha: float
    n_best: int
    max_len_a: float
    max_len_b: int
    sampling: bool
    temperature: float
    top_k: int
    top_p: float
    seed: int
    alone: int = 0  # a sampled request's own number: its lines' random streams follow their
    # places in the request, which a batch shared with others would shift

    @classmethod
    def of(cls, request: TranslateRequest) -> TranslateOptions:
        if request.sampling and request.n_best > 1:
            raise RequestError(422, "n_best", "n_best must be 1 when sampling")
        if not request.sampling and request.n_best > request.beam:
            raise RequestError(422, "n_best", f"n_best ({request.n_best}) exceeds beam")
        fields = {
            name: getattr(request, name) for name in cls.__dataclass_fields__ if name != "alone"
        }
        # Options of the other search are ignored (the page sends them all): set to their
        # defaults, so that they do not keep a request out of a batch.
        ignored = ("beam", "alpha") if request.sampling else SAMPLING_FIELDS
        fields.update({name: TranslateRequest.model_fields[name].default for name in ignored})
        return cls(**fields, alone=next(_SAMPLED) if request.sampling else 0)


_SAMPLED = itertools.count(1)


class ServedTranslator:
    task = "translation"

    def __init__(
        self, name: str, run_dir: Path, translator: Translator, engine: str, batcher: Batching
    ) -> None:
        self.name, self.run_dir, self.translator, self.engine = name, run_dir, translator, engine
        # CTranslate2 decodes calls side by side, one a replica: a batch gathers while one runs
        workers = 1 if translator.engine is None else translator.engine.replicas
        self.batcher = Batcher(self._run, batcher.window, batcher.max_tokens, workers)

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "task": self.task, "engine": self.engine}

    def _run(self, options: Hashable, texts: list[str]) -> Sequence[Any]:
        assert isinstance(options, TranslateOptions)
        o = options
        search = (
            {name: getattr(o, name) for name in SAMPLING_FIELDS}
            if o.sampling
            else {"beam_size": o.beam, "alpha": o.alpha}
        )
        return self.translator.hypotheses(
            texts,
            n_best=o.n_best,
            max_len_a=o.max_len_a,
            max_len_b=o.max_len_b,
            sampling=o.sampling,
            **search,
        )

    async def answer(self, request: TranslateRequest) -> list[dict[str, Any]]:
        options = TranslateOptions.of(request)
        tokens = sum(len(ids) for ids in self.translator.encode(request.texts))
        found = await asyncio.wrap_future(self.batcher.submit(options, request.texts, tokens))
        out = [
            {"translation": h[0].text, "score": h[0].score, "n_best": [asdict(x) for x in h]}
            for h in found
        ]
        if request.attention:  # a forward pass a text, in a thread: the event loop serves on
            texts = zip(request.texts, found, strict=True)
            maps = await asyncio.to_thread(
                lambda: [translation_attention(self.translator, t, h[0].ids) for t, h in texts]
            )
            for item, attention in zip(out, maps, strict=True):
                item["attention"] = attention
        return out


class ServedClassifier:
    task = "classification"

    def __init__(self, name: str, run_dir: Path, classifier: Classifier, batcher: Batching) -> None:
        self.name, self.run_dir, self.classifier = name, run_dir, classifier
        self.batcher = Batcher(self._run, batcher.window, batcher.max_tokens)
        self.engine = "torch"

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "task": self.task, "engine": "torch", "labels": self.labels}

    @property
    def labels(self) -> list[str]:
        return self.classifier.labels

    def _run(self, options: Hashable, texts: list[str]) -> Sequence[Any]:
        return self.classifier.probabilities(texts).tolist()

    async def answer(self, request: ClassifyRequest) -> list[dict[str, Any]]:
        tokens = sum(len(text) for text in request.texts) // 4 + len(request.texts)
        found = await asyncio.wrap_future(self.batcher.submit(None, request.texts, tokens))
        out = []
        for probabilities in found:
            best = max(range(len(probabilities)), key=probabilities.__getitem__)
            labelled = dict(zip(self.labels, probabilities, strict=True))
            out.append({"label": self.labels[best], "probabilities": labelled})
        if request.attention:  # as for translation
            maps = await asyncio.to_thread(
                lambda: [classification_attention(self.classifier, t) for t in request.texts]
            )
            for item, attention in zip(out, maps, strict=True):
                item["attention"] = attention
        return out


Served = ServedTranslator | ServedClassifier


@dataclass(frozen=True)
class Batching:
    """How long a batch gathers requests (seconds), and the source tokens it may hold."""

    window: float = 0.01
    max_tokens: int = 8192


def load_served(
    run_dirs: Sequence[Path],
    engine: str = "torch",
    quantize: str | None = None,
    batching: Batching | None = None,
) -> dict[str, Served]:
    """Each run under its directory's name (`name`, `name-2`, ... when names repeat)."""
    batching = batching or Batching()
    served: dict[str, Served] = {}
    for run_dir in run_dirs:
        name, n = run_dir.resolve().name, 1
        while name in served:
            n += 1
            name = f"{run_dir.resolve().name}-{n}"
        task = RunConfig.load(run_dir).task
        if task == "translation":
            translator = Translator.load(run_dir, engine=engine, quantize=quantize)
            served[name] = ServedTranslator(name, run_dir, translator, engine, batching)
        else:
            classifier = Classifier.load(run_dir)
            served[name] = ServedClassifier(name, run_dir, classifier, batching)
    return served
