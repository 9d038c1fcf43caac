"""The run directory, the unit users hand around:

    RUN/config.json        resolved configuration with a format version
    RUN/tokenizer.json     the subword tokenizer
    RUN/model.safetensors  best (or averaged) weights
    RUN/checkpoints/       full training state, for --resume
    RUN/metrics.jsonl      one JSON record per log line

Loading a run needs only its path, and unpickles nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from torch import nn

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

from qkv import __version__
from qkv.data.tokenizer import Tokenizer
from qkv.errors import CheckpointError, ConfigError
from qkv.fits import typed_section
from qkv.model.config import ModelConfig
from qkv.training.checkpoint import atomic_write_text, load_weights
from qkv.training.config import TrainConfig
from qkv.training.distributed import is_main

RUN_FORMAT = 1
T = TypeVar("T")
TASKS = ("translation", "classification")
CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE = "config.json", "tokenizer.json", "model.safetensors"
LOCK_FILE = ".lock"


@dataclass
class RunConfig:
    """Everything needed to rebuild a run's model and data pipeline."""

    task: str  # "translation" or "classification"
    model: ModelConfig
    train: TrainConfig
    data: dict[str, Any] = field(default_factory=dict)  # task-specific data settings

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": RUN_FORMAT,
            "qkv_version": __version__,
            "task": self.task,
            "model": self.model.to_dict(),
            "train": self.train.to_dict(),
            "data": self.data,
        }

    def save(self, run_dir: Path) -> None:
        """Writes RUN/config.json (under torchrun, rank 0 alone writes the run)."""
        if not is_main():
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / CONFIG_FILE, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, run_dir: Path) -> RunConfig:
        path = run_dir / CONFIG_FILE
        if run_dir.is_file():
            raise CheckpointError(f"{run_dir}: a file, not a run directory")
        if not run_dir.is_dir():
            raise CheckpointError(f"{run_dir}: run directory not found")
        if not path.is_file():
            raise CheckpointError(f"{path}: not found; is {run_dir} a qkv run directory?")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as error:
            raise CheckpointError(f"{path}: corrupt ({error})") from None
        if not isinstance(raw, dict):
            raise CheckpointError(f"{path}: expected a JSON object")
        if raw.get("format_version") != RUN_FORMAT:
            raise CheckpointError(
                f"{path}: run format {raw.get('format_version')!r} is not supported by qkv "
                f"{__version__} (reads format {RUN_FORMAT})"
            )
        if raw.get("task") not in TASKS:
            raise CheckpointError(
                f"{path}: unknown task {raw.get('task')!r} (expected {' or '.join(TASKS)})"
            )
        if missing := [name for name in ("model", "train") if name not in raw]:
            raise CheckpointError(f"{path}: invalid config (no {' or '.join(missing)} section)")
        try:
            model = typed_section(raw["model"], ModelConfig, "model")
            # qkv writes every field: a default for a missing one may not fit the weights,
            # which would then be blamed.
            if lacking := [f.name for f in fields(ModelConfig) if f.name not in model]:
                raise ConfigError(f"the model section has no {', '.join(lacking)}")
            return cls(
                task=raw["task"],
                model=ModelConfig.from_dict(model),
                train=TrainConfig.from_dict(typed_section(raw["train"], TrainConfig, "train")),
                data=typed_section(raw.get("data", {}), dict, "data"),
            )
        except (KeyError, TypeError, ConfigError) as error:
            raise CheckpointError(f"{path}: invalid config ({error})") from None


@contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Holds `RUN/.lock` while training into `run_dir` (created if missing), so that a second
    process is refused rather than mixing its files in. The kernel releases the lock when the
    process ends, however it ends."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if fcntl is None:  # not a POSIX system: no lock
        yield
        return
    with open(run_dir / LOCK_FILE, "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "another process"
            raise ConfigError(
                f"{run_dir} is being trained by {owner}; wait for it to end"
            ) from None
        handle.truncate(0)
        handle.write(f"process {os.getpid()}")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def load_run_weights(model: nn.Module, run_dir: Path) -> None:
    """Loads a run's best weights into `model`."""
    path = run_dir / WEIGHTS_FILE
    if not path.exists():  # `run_dir` holds a run: the caller loaded its config
        raise CheckpointError(
            f"{path}: not written yet (training stopped, or is still, before its first "
            f"validation); continue it with: qkv train --resume {run_dir}"
        )
    load_weights(model, path)


def load_tokenizer(run_dir: Path) -> Tokenizer:
    return Tokenizer.load(run_dir / TOKENIZER_FILE)


M = TypeVar("M", bound=nn.Module)


def build_model(factory: Callable[[ModelConfig], M], config: ModelConfig) -> M:
    """`factory(config)`, raising a one-line ConfigError, not a traceback, for a config it
    refuses or a model too large for memory."""
    try:
        return factory(config)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    except RuntimeError as error:  # torch's allocators say "can't allocate" or "out of memory"
        if "allocate" not in str(error) and "out of memory" not in str(error):
            raise
        reason = str(error).splitlines()[0]
        raise ConfigError(
            f"the model does not fit in memory (d_model {config.d_model}, "
            f"d_ff {config.d_ff}, vocabulary {config.vocab_size}): {reason}"
        ) from None


def data_settings(kind: type[T], values: dict[str, Any], run_dir: Path) -> T:
    """A task's data settings from config.json; CheckpointError when they do not fit."""
    try:
        return kind(**typed_section(values, kind, "data"))
    except (TypeError, ConfigError) as error:
        raise CheckpointError(
            f"{run_dir / CONFIG_FILE}: data section does not fit ({error})"
        ) from None
