"""Label texts with a trained run: `Classifier.load(run_dir).predict(texts)`."""

from __future__ import annotations

from pathlib import Path

import torch

from qkv import fast
from qkv.data.batching import collate_texts, token_budget_batches
from qkv.data.readers import is_blank, texts_list
from qkv.data.tokenizer import Tokenizer
from qkv.errors import CheckpointError, ConfigError
from qkv.fits import fits
from qkv.model.classifier import TextClassifier
from qkv.run import RunConfig, load_run_weights, load_tokenizer
from qkv.tasks.classification import ClassificationData, clean_text, encode_texts, run_data
from qkv.training.speed import pick_device


class Classifier:
    """A trained text classifier with its tokenizer and label names."""

    def __init__(
        self,
        model: TextClassifier,
        tokenizer: Tokenizer,
        data: ClassificationData,
        device: torch.device | str,
    ) -> None:
        self.device = torch.device(device)  # a name ("cpu") too
        self.model, self.tokenizer, self.data = model.eval().to(self.device), tokenizer, data

    @property
    def labels(self) -> list[str]:
        return self.data.labels

    @classmethod
    def load(cls, run_dir: str | Path, device: str = "auto") -> Classifier:
        """Load a run directory written by `qkv train classification`."""
        run_dir = Path(run_dir)
        config = RunConfig.load(run_dir)
        if config.task != "classification":
            raise CheckpointError(f"{run_dir}: a {config.task} run, not a classification run")
        data = run_data(config, run_dir)
        tokenizer = load_tokenizer(run_dir)
        model = TextClassifier(config.model)
        load_run_weights(model, run_dir)
        fast.apply(model)
        return cls(model, tokenizer, data, pick_device(device))

    @torch.no_grad()
    def probabilities(self, texts: list[str], max_tokens: int = 16384) -> torch.Tensor:
        """Class probabilities (len(texts), C), in input order. Raises TypeError unless `texts`
        is a list of strings, ConfigError if a text has no tokens once cleaned or `max_tokens`
        (tokens a batch) is not a count >= 1."""
        texts = texts_list(texts, "texts")
        if not fits(max_tokens, int) or max_tokens < 1:
            raise ConfigError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        ids = encode_texts(self.tokenizer, texts, self.data)
        empty = next(
            (i for i, x in enumerate(ids) if not x or is_blank(clean_text(texts[i]))), None
        )
        if empty is not None:
            raise ConfigError(f"text {empty + 1} has no tokens once cleaned: {texts[empty]!r}")
        out = torch.zeros(len(texts), len(self.labels))
        lengths = [len(x) + 1 for x in ids]
        was_training = self.model.training
        self.model.eval()  # no dropout, whatever mode the caller left the model in
        try:
            for batch in token_budget_batches(lengths, max_tokens, shuffle=False, seed=0, epoch=0):
                rows = collate_texts([ids[i] for i in batch], [0] * len(batch), cls=self.data.cls)
                logits = self.model(rows.ids.to(self.device))  # (B, C)
                out[batch] = torch.softmax(logits.float(), dim=-1).cpu()
        finally:
            self.model.train(was_training)
        return out

    def predict(self, texts: list[str], max_tokens: int = 16384) -> list[tuple[str, float]]:
        """The most likely label of each text and its probability."""
        best, labels = self.probabilities(texts, max_tokens).max(dim=-1)  # (N,), (N,)
        return [(self.labels[i], p) for p, i in zip(best.tolist(), labels.tolist(), strict=True)]
