"""Text classification: labelled texts in, a trained run directory out."""

from __future__ import annotations

import os
import random
import re
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from qkv import fast
from qkv.data.batching import (
    Row,
    collate_texts,
    token_budget_arrays,
    token_budget_batches,
    truncate,
)
from qkv.data.cache import (
    CACHE_FILE,
    TokenCacheWriter,
    check_same_data,
    open_token_cache,
    text_digest,
)
from qkv.data.lines import CHUNK_LINES
from qkv.data.readers import read_labelled, record_fields, short_text
from qkv.data.token_array import TokenArray, id_lists, token_array
from qkv.data.tokenizer import Tokenizer, check_vocabulary, size_note
from qkv.errors import CheckpointError, ConfigError, DataError
from qkv.model.classifier import TextClassifier
from qkv.model.config import MAX_POSITIONS, ModelConfig
from qkv.run import (
    CONFIG_FILE,
    TOKENIZER_FILE,
    RunConfig,
    build_model,
    data_settings,
    load_tokenizer,
)
from qkv.training.config import TrainConfig
from qkv.training.distributed import check_same_settings, is_main, main_first
from qkv.training.plan import planned
from qkv.training.speed import pick_device, set_up_process
from qkv.training.trainer import Progress, Trainer
from qkv.viz.curves import write_curves

_BREAKS = re.compile(r"<br\s*/?>", re.IGNORECASE)
_INTEGER = re.compile(r"-?[0-9]+")
FIELD_SETTINGS = ("text_field=NAME", "label_field=NAME")  # how a new run names other fields


def clean_text(text: str) -> str:
    """`text` with HTML line breaks (as in IMDB reviews) as spaces and runs of spaces collapsed."""
    return " ".join(_BREAKS.sub(" ", text).split())


@dataclass
class ClassificationData:
    """Where the labelled texts are and how to turn them into tokens."""

    train_file: str = ""  # JSONL, CSV or TSV (optionally .gz)
    valid_file: str = ""  # empty: hold out valid_fraction of the training file
    valid_fraction: float = 0.1  # share of the training file held out for validation
    split_seed: int | None = None  # the held-out share's shuffle, the run's first seed
    text_field: str = "text"  # column or key of the text
    label_field: str = "label"  # column or key of the label
    vocab_size: int = 16000  # BPE vocabulary size
    min_frequency: int = 2  # BPE merges need this many occurrences
    lowercase: bool = False  # lowercase before BPE
    max_len: int = 256  # tokens kept per text
    head_tail: bool = True  # keep the head and tail of long texts (else the head)
    cls: bool = False  # prepend a [CLS] token (follows the model's pooling)
    labels: list[str] = field(default_factory=list)  # label names, filled from the data

    def read(
        self,
        path: str | Path,
        known_labels: Collection[str] | None = None,
        hints: Sequence[str] | None = FIELD_SETTINGS,
    ) -> tuple[list[str], list[str]]:
        """(texts, labels) of a labelled file, by this data's fields; a text empty once
        cleaned is refused (see `readers.read_labelled`). A file that lacks a field is
        reported with how to name another (`hints`: by default the settings, for a new run)."""
        return read_labelled(
            Path(path),
            text_field=self.text_field,
            label_field=self.label_field,
            known_labels=known_labels,
            clean=clean_text,
            hints=hints,
        )

    def check(self) -> None:
        """Raises ConfigError for settings out of range; checked for new runs only, so a
        saved run still loads."""
        check_vocabulary(self.vocab_size, self.min_frequency)
        if not 1 + self.cls <= self.max_len <= MAX_POSITIONS:
            extra = " with a [CLS] token (pooling=cls)" if self.cls else ""
            raise ConfigError(
                f"max_len must be at least {1 + self.cls}{extra} and at most {MAX_POSITIONS}, "
                f"got {self.max_len}"
            )
        if self.split_seed is not None and not 0 <= self.split_seed < 2**63:
            raise ConfigError(f"split_seed must be between 0 and 2**63 - 1, got {self.split_seed}")
        if not self.valid_file and not 0 < self.valid_fraction < 1:
            raise ConfigError(
                f"valid_fraction is the share of the training file held out for validation, "
                f"between 0 and 1 (both excluded); got {self.valid_fraction}"
            )


TEXT_NAMES = ("text", "sentence", "review", "content", "document")  # the commonest in data sets
LABEL_NAMES = ("label", "labels", "sentiment", "polarity", "class", "category", "target")
ID_NAMES = ("id", "idx", "index", "guid")  # never taken for the text


def found_fields(data: ClassificationData, given: Collection[str]) -> str:
    """For a new run whose training file lacks the default fields, those of its fields that
    data sets commonly name so (`TEXT_NAMES`, `LABEL_NAMES`, in any case; for the text, else
    the one field besides the label and an id), set on `data` unless `given`; a note saying
    which."""
    fields = record_fields(data.train_file)
    by_name = {name.casefold(): name for name in fields}
    notes = []
    label = next((by_name[n] for n in LABEL_NAMES if n in by_name), None)
    if label and "label_field" not in given and data.label_field not in fields:
        data.label_field = label
        notes.append(f"labels from '{label}'")
    if "text_field" not in given and data.text_field not in fields:
        others = [n for n in fields if n != data.label_field and n.casefold() not in ID_NAMES]
        found = next((by_name[n] for n in TEXT_NAMES if n in by_name), None)
        if found := found or (others[0] if len(others) == 1 else None):
            data.text_field = found
            notes.append(f"texts from '{found}'")
    if not notes:
        return ""
    return f"reading {' and '.join(notes)} (text_field= and label_field= name others)"


def sorted_labels(values: list[str]) -> list[str]:
    """Label names in a stable order: numerically when they are all integers."""
    unique = set(values)
    if all(_INTEGER.fullmatch(v) for v in unique):  # "1" and "01" by their text, run to run
        return sorted(unique, key=lambda v: (int(v), v))
    return sorted(unique)


def encode_texts(
    tokenizer: Tokenizer, texts: list[str], data: ClassificationData
) -> list[list[int]]:
    """Texts cleaned, tokenized and truncated to what the model sees (room left for [CLS])."""
    room = data.max_len - (1 if data.cls else 0)
    return [
        truncate(ids, room, data.head_tail)
        for ids in tokenizer.encode_batch([clean_text(t) for t in texts])
    ]


class ClassificationTask:
    """Batches, loss and validation (loss, accuracy) of a text classifier."""

    metric = "accuracy"

    def __init__(
        self,
        model: TextClassifier,
        corpora: Mapping[str, TokenArray | Sequence[Sequence[int]]],
        data: ClassificationData,
        train: TrainConfig,
    ) -> None:
        """`corpora` holds "train.ids" (read from the token cache as batches need them),
        "train.labels", "valid.ids" and "valid.labels" (one class index a row)."""
        self.model, self.data, self.train_config = model, data, train
        self.ids, self.labels = token_array(corpora["train.ids"]), _labels(corpora["train.labels"])
        self.valid_ids = id_lists(corpora["valid.ids"])
        self.valid_labels = _labels(corpora["valid.labels"]).tolist()
        # What always answering the commonest validation label scores: a wasted run's mark.
        commonest = max(Counter(self.valid_labels).values(), default=0)
        self.trivial = commonest / max(len(self.valid_labels), 1)
        self.lengths = self.ids.lengths + (1 if data.cls else 0)  # (n,)

    def batches(self, epoch: int) -> list[np.ndarray]:
        c = self.train_config
        return token_budget_arrays(
            self.lengths, c.max_tokens, shuffle=True, seed=c.seed, epoch=epoch
        )

    def n_targets(self, batch: Sequence[int] | np.ndarray) -> int:
        return len(batch)

    def _scores(
        self, ids: Sequence[Row], labels: Sequence[int], smoothing: float, device: torch.device
    ) -> tuple[torch.Tensor, int]:
        """The summed cross-entropy of a batch and how many it classifies right."""
        texts = collate_texts(ids, labels, cls=self.data.cls).to(device)
        logits = self.model(texts.ids)  # (B, C)
        loss = F.cross_entropy(
            logits.float(), texts.labels, reduction="sum", label_smoothing=smoothing
        )
        return loss, int((logits.argmax(-1) == texts.labels).sum())

    def loss(
        self, batch: Sequence[int] | np.ndarray, device: torch.device
    ) -> tuple[torch.Tensor, dict[str, float]]:
        ids, labels = self.ids.rows(batch), self.labels[np.asarray(batch)].tolist()
        loss, correct = self._scores(ids, labels, self.train_config.label_smoothing, device)
        return loss, {"accuracy": float(correct)}

    def evaluate(self, device: torch.device) -> dict[str, float]:
        total, correct = 0.0, 0
        lengths = [len(x) for x in self.valid_ids]
        budget = self.train_config.max_tokens * 2
        for batch in token_budget_batches(lengths, budget, shuffle=False, seed=0, epoch=0):
            ids, labels = [self.valid_ids[i] for i in batch], [self.valid_labels[i] for i in batch]
            loss, right = self._scores(ids, labels, 0.0, device)
            total += float(loss)
            correct += right
        n = max(len(self.valid_ids), 1)
        return {"loss": total / n, "accuracy": correct / n}


def _labels(rows: TokenArray | Sequence[Sequence[int]]) -> np.ndarray:
    """(n,) int64 class indices of rows of one id each."""
    return token_array(rows).flat().astype(np.int64)


def _split(
    path: str, texts: list[str], labels: list[str], fraction: float, seed: int
) -> tuple[list[str], list[str], list[str], list[str]]:
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    n_valid = max(1, round(len(texts) * fraction))
    if n_valid >= len(texts):
        raise DataError(path, f"too few examples ({len(texts)}) to hold out {fraction:.0%}")
    valid, train = order[:n_valid], order[n_valid:]
    return (
        [texts[i] for i in train],
        [labels[i] for i in train],
        [texts[i] for i in valid],
        [labels[i] for i in valid],
    )


def label_notes(names: Sequence[str], labels: Sequence[str], field: str) -> list[str]:
    """A line naming the labels with their training examples, and warnings for a label that
    looks like a mistake: the label column's name (a second header row) or a single example."""
    counts = Counter(labels)
    listed = ", ".join(f"{short_text(name)} {counts[name]:,}" for name in names[:10])
    more = f", and {len(names) - 10} more" if len(names) > 10 else ""
    notes = [f"{len(names)} labels, with their training examples: {listed}{more}"]
    header = [name for name in names if name.casefold() == field.casefold()]
    if header:
        notes.append(f"warning: a label is the label column's name, '{field}': a header row?")
    if once := [name for name in names if counts[name] == 1 and name not in header]:
        notes.append(f"warning: one training example only for {shown(once)}: a typo?")
    return notes


def shown(labels: Sequence[str], limit: int = 5) -> str:
    """The first `limit` labels for a message, each cut to 40 characters."""
    return ", ".join(map(short_text, labels[:limit])) + (", ..." if len(labels) > limit else "")


def run_data(run: RunConfig, run_dir: Path) -> ClassificationData:
    """A classification run's data settings, checked against its model (CheckpointError)."""
    data = data_settings(ClassificationData, run.data, run_dir)
    labels, classes = data.labels, run.model.n_classes
    if len(labels) != classes or len(set(labels)) < len(labels):
        raise CheckpointError(
            f"{run_dir / CONFIG_FILE}: data.labels must name the model's {classes} classes, "
            f"each once; it names {len(labels)}: {shown(labels)}"
        )
    return data


def prepare(
    data: ClassificationData,
    run_dir: Path,
    tokenizer: Tokenizer | None,
    seed: int,
    train_records: tuple[list[str], list[str]] | None = None,
) -> tuple[Tokenizer, dict[str, TokenArray], ClassificationData]:
    """Reads (unless `train_records` holds the training file's texts and labels) and splits
    the data, trains the tokenizer (unless given), tokenizes once and caches. A resumed run
    (`tokenizer` given) must find the text its cache holds."""
    new_run = tokenizer is None  # a cache found in run_dir was not made with its tokenizer
    cache_path = run_dir / CACHE_FILE
    hints = FIELD_SETTINGS if new_run else None
    texts, labels = train_records or data.read(data.train_file, hints=hints)
    digests = {"train": text_digest(texts, labels)}
    if not new_run:
        check_same_data(cache_path, {"train": (Path(data.train_file), digests["train"])})
    if not data.valid_file:  # the same share as the run began with, whatever its seed now
        data.split_seed = seed if data.split_seed is None else data.split_seed
        texts, labels, valid_texts, valid_labels = _split(
            data.train_file, texts, labels, data.valid_fraction, data.split_seed
        )
    names = data.labels or sorted_labels(labels)
    if len(set(names)) < len(names):
        raise ConfigError(f"labels= names a label twice: {shown(names)}")
    if data.labels and (unnamed := sorted(set(labels) - set(names))):
        named = "labels= does not name" if new_run else "the run was not trained on"
        raise DataError(
            data.train_file,
            f"has labels that {named}: {shown(unnamed)} (the run's labels: {shown(names)})",
        )
    if len(names) < 2:
        held_out = "" if data.valid_file else " once the validation share is held out"
        raise DataError(
            data.train_file, f"needs at least 2 labels{held_out}; it has only {shown(names)}"
        )
    if data.valid_file:  # an unknown label there is named with its line
        valid_texts, valid_labels = data.read(data.valid_file, names, hints)
        digests["valid"] = text_digest(valid_texts, valid_labels)
        if not new_run:
            check_same_data(cache_path, {"valid": (Path(data.valid_file), digests["valid"])})
    elif unknown := sorted(set(valid_labels) - set(names)):
        raise DataError(
            data.train_file,
            f"the held-out validation share has labels the rest lacks: {shown(unknown)}; "
            "give more examples of them or a --valid file",
        )
    index = {name: i for i, name in enumerate(names)}
    data.labels = names
    if new_run and is_main():
        print("\n".join(label_notes(names, labels, data.label_field)))
        seen = set(texts)
        if (shared := sum(text in seen for text in valid_texts)) * 2 > len(valid_texts):
            print(
                f"warning: {shared:,} of the {len(valid_texts):,} validation texts are training "
                "texts too: validation measures what the model learned by heart"
            )
    if tokenizer is None:
        tokenizer = Tokenizer.train(
            (clean_text(t) for t in texts), data.vocab_size, data.min_frequency, data.lowercase
        )
        if note := size_note(tokenizer, data.vocab_size):
            print(note)
        tokenizer.save(run_dir / TOKENIZER_FILE)
    cache = None if new_run else open_token_cache(cache_path)
    if cache is None:
        with TokenCacheWriter(cache_path) as writer:
            for split, split_texts, split_labels in (
                ("train", texts, labels),
                ("valid", valid_texts, valid_labels),
            ):
                # An empty split still gets its (empty) array.
                for start in range(0, max(len(split_texts), 1), CHUNK_LINES):
                    chunk = split_texts[start : start + CHUNK_LINES]
                    writer.add(f"{split}.ids", encode_texts(tokenizer, chunk, data))
                classes = np.array([index[y] for y in split_labels], dtype=np.int32)
                writer.append(f"{split}.labels", classes, np.ones(len(classes), np.int64))
            cache = writer.finish(digests)
    return tokenizer, cache.arrays, data


def train_classification(
    data: ClassificationData | None,
    model_config: ModelConfig | None,
    train_config: TrainConfig | None,
    run_dir: Path,
    resume: RunConfig | None = None,
    explicit: frozenset[str] = frozenset(),
    train_records: tuple[list[str], list[str]] | None = None,
) -> Progress:
    """Trains a text classifier into `run_dir`, or continues the run `resume` (its
    configuration, with changes saved once the data checks out). A new run's schedule is
    planned from the data's size (`qkv.training.plan`), but for the settings in `explicit`.
    `train_records`: the training file's (texts, labels), if the caller has read them."""
    tokenizer: Tokenizer | None = None
    if resume:
        data, model_config, train_config = run_data(resume, run_dir), resume.model, resume.train
        tokenizer = load_tokenizer(run_dir)
    else:
        assert data is not None and model_config is not None and train_config is not None
        data.cls = model_config.pooling == "cls"
        data.check()
        # Absolute, so that `--resume` finds them from any working directory.
        data.train_file = os.path.abspath(data.train_file) if data.train_file else ""
        data.valid_file = os.path.abspath(data.valid_file) if data.valid_file else ""
    device = pick_device(train_config.device)  # before any work: a missing GPU fails first
    run_dir.mkdir(parents=True, exist_ok=True)
    set_up_process(train_config)
    check_same_settings(model_config, train_config, data)  # under torchrun
    with main_first():  # rank 0 trains the tokenizer and caches the tokens; the others read them
        if tokenizer is None and not is_main():
            tokenizer = load_tokenizer(run_dir)
        tokenizer, corpora, data = prepare(
            data, run_dir, tokenizer, train_config.seed, None if resume else train_records
        )
    if not resume:
        model_config = replace(
            model_config,
            vocab_size=tokenizer.vocab_size,
            n_classes=len(data.labels),
            n_decoder_layers=0,
            max_len=max(model_config.max_len, data.max_len),
        )
    random.seed(train_config.seed)
    torch.manual_seed(train_config.seed)
    model = build_model(TextClassifier, model_config)  # before the run is saved
    if train_config.fast:
        fast.apply(model)
    plan = ""
    if not resume:
        train_config, plan = planned(train_config, corpora["train.ids"].lengths + 1, explicit)
    if not resume:
        RunConfig("classification", model_config, train_config, asdict(data)).save(run_dir)
    task = ClassificationTask(model, corpora, data, train_config)
    trainer = Trainer(task, train_config, run_dir, device)
    trainer.plan = plan
    if resume:
        trainer.resume()
        resume.save(run_dir)  # the new settings, once the run resumes
    progress = trainer.train()
    if is_main():
        write_curves(run_dir)
    return progress
