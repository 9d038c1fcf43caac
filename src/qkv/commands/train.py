"""`qkv train`: build configs from a preset, flags and key=value overrides, then train."""

from __future__ import annotations

import argparse
from pathlib import Path

from qkv import overrides
from qkv.errors import ConfigError


def run(args: argparse.Namespace) -> int:
    if args.resume:
        return _resume(Path(args.resume))
    if args.task is None or args.out is None:
        raise ConfigError("train needs a task (translation or classification) and --out RUN")
    out = Path(args.out)
    if (out / "config.json").exists():
        raise ConfigError(f"{out} already holds a run; continue it with --resume {out}")
    values = overrides.parse_pairs(args.overrides)
    if args.task == "translation":
        return _translation(args, out, values)
    from qkv.commands.train_classification import train as train_classification

    return train_classification(args, out, values)


def _resume(run_dir: Path) -> int:
    from qkv.run import RunConfig

    task = RunConfig.load(run_dir).task
    if task == "translation":
        from qkv.tasks.translation import train_translation

        train_translation(None, None, None, run_dir, resume=True)
    else:
        from qkv.tasks.classification import train_classification

        train_classification(None, None, None, run_dir, resume=True)
    print(f"done: {run_dir}")
    return 0


def _translation(args: argparse.Namespace, out: Path, values: dict[str, str]) -> int:
    from qkv.presets import translation_preset
    from qkv.tasks.translation import TranslationData, train_translation

    if not args.data:
        raise ConfigError("train translation needs --data DIR")
    model, train = translation_preset(args.preset or "small")
    data = TranslationData(data_dir=args.data, src=args.src, tgt=args.tgt)
    data, values = overrides.apply(data, values)
    model, values = overrides.apply(model, values)
    train, values = overrides.apply(train, values)
    if values:
        raise ConfigError(f"unknown setting(s): {', '.join(sorted(values))}")
    progress = train_translation(data, model, train, out)
    print(f"done: {out} (best bleu {progress.best:.2f} at step {progress.best_step})")
    print(f"translate with: qkv translate {out} --input FILE")
    return 0
