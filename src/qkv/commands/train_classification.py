"""`qkv train classification`: configs from a preset, flags and overrides, then train."""

from __future__ import annotations

import argparse
from pathlib import Path

from qkv import overrides
from qkv.commands.train import report_done
from qkv.errors import ConfigError


def train(args: argparse.Namespace, out: Path, values: dict[str, str]) -> int:
    from qkv.presets import classification_preset
    from qkv.tasks.classification import ClassificationData, train_classification

    if not args.train:
        raise ConfigError("train classification needs --train FILE")
    model, train_config, data = classification_preset(args.preset or "strong")
    data = ClassificationData(
        **{
            **data.__dict__,
            "train_file": args.train,
            "valid_file": args.valid or "",
            "valid_fraction": data.valid_fraction
            if args.valid_fraction is None
            else args.valid_fraction,
        }
    )
    data, model, train_config = overrides.apply_all(data, model, train_config, values)
    progress = train_classification(data, model, train_config, out)
    return report_done("classification", out, progress)
