"""The run directory: the unit users hand around.

    RUN/config.json        resolved configuration with a format version
    RUN/tokenizer.json     the subword tokenizer
    RUN/model.safetensors  best (or averaged) weights
    RUN/checkpoints/       full training state, for --resume
    RUN/metrics.jsonl      one JSON record per log line

Everything that loads a run needs only its path; nothing here unpickles anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qkv import __version__
from qkv.data.tokenizer import Tokenizer
from qkv.errors import CheckpointError, ConfigError
from qkv.model.config import ModelConfig
from qkv.training.checkpoint import atomic_write_text
from qkv.training.config import TrainConfig

RUN_FORMAT = 1
CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE = "config.json", "tokenizer.json", "model.safetensors"


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
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / CONFIG_FILE, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, run_dir: Path) -> RunConfig:
        path = run_dir / CONFIG_FILE
        if not run_dir.is_dir():
            raise CheckpointError(f"{run_dir}: run directory not found")
        if not path.is_file():
            raise CheckpointError(f"{path}: not found; is {run_dir} a qkv run directory?")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise CheckpointError(f"{path}: corrupt ({error})") from None
        if not isinstance(raw, dict):
            raise CheckpointError(f"{path}: expected a JSON object")
        if raw.get("format_version") != RUN_FORMAT:
            raise CheckpointError(
                f"{path}: run format {raw.get('format_version')!r} is not supported by qkv "
                f"{__version__} (reads format {RUN_FORMAT})"
            )
        try:
            return cls(
                task=str(raw["task"]),
                model=ModelConfig.from_dict(raw["model"]),
                train=TrainConfig.from_dict(raw["train"]),
                data=dict(raw.get("data", {})),
            )
        except (KeyError, TypeError, ConfigError) as error:
            raise CheckpointError(f"{path}: invalid config ({error})") from None


def load_tokenizer(run_dir: Path) -> Tokenizer:
    return Tokenizer.load(run_dir / TOKENIZER_FILE)
