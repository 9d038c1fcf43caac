"""`qkv train`: build configs from a preset, flags and key=value overrides, then train.

Under torchrun (`torchrun --nproc-per-node N -m qkv train ...`) every process runs this, joined
in one process group (`qkv.training.distributed`); rank 0 alone holds the run's lock, checks
and writes the run directory, and prints.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
from pathlib import Path

from qkv import overrides
from qkv.cli import given_options
from qkv.errors import ConfigError
from qkv.run import CONFIG_FILE, LOCK_FILE, TASKS, RunConfig, run_lock
from qkv.training import distributed
from qkv.training.trainer import Progress

NOT_FOR = {
    "translation": {"n_classes", "pooling", "head_dropout"},
    "classification": {"n_decoder_layers", "tgt_vocab_size", "tie_embeddings"},
}
"""Model settings that do not apply to a task's model."""
FLAG_SETTINGS = {
    "translation": {"--data": "data_dir", "--src": "src", "--tgt": "tgt"},
    "classification": {
        "--train": "train_file",
        "--valid": "valid_file",
        "--valid-fraction": "valid_fraction",
    },
}
"""The flags of `qkv train` that belong to each task, and the data setting each sets."""
DATA_PATHS = ("data_dir", "train_file", "valid_file")
"""Data settings that may change on `--resume`: where the same data now lives."""


def run(args: argparse.Namespace) -> int:
    try:
        with distributed.joined(), contextlib.ExitStack() as quiet:
            if not distributed.is_main():  # under torchrun, rank 0 alone prints (errors show)
                null = quiet.enter_context(open(os.devnull, "w", encoding="utf-8"))
                quiet.enter_context(contextlib.redirect_stdout(null))
            return _run(args)
    except distributed.RankLost as error:
        run_dir = Path(args.resume or args.out or "")
        if not (run_dir / CONFIG_FILE).is_file():
            raise
        raise distributed.RankLost(
            f"{error}; continue from the run's newest checkpoint with: "
            f"torchrun ... -m qkv train --resume {run_dir}"
        ) from None


def _run(args: argparse.Namespace) -> int:
    if args.task is not None and "=" in args.task:  # a key=value, not a task
        args.overrides, args.task = [args.task, *args.overrides], None
    if args.resume:
        if args.task is not None and args.task not in TASKS:  # a word in place of a setting
            raise ConfigError(f"expected key=value, got {args.task!r}")
        flags = ("task", "--out", "--preset", *FLAG_SETTINGS["translation"])
        if given := given_options(args, (*flags, *FLAG_SETTINGS["classification"])):
            raise ConfigError(
                f"--resume continues a run with its own settings, so {given[0]} does not apply "
                "(data that moved: data_dir=, train_file= or valid_file=)"
            )
        return _resume(Path(args.resume), overrides.parse_pairs(args.overrides))
    if args.task is not None and args.task not in TASKS:
        raise ConfigError(f"unknown task {args.task!r}: train translation or classification")
    if args.task is None or args.out is None:
        raise ConfigError("train needs a task (translation or classification) and --out RUN")
    if not args.out.strip():
        raise ConfigError("--out is empty; name the directory of the run")
    other = "classification" if args.task == "translation" else "translation"
    if given := given_options(args, tuple(FLAG_SETTINGS[other])):
        raise ConfigError(f"{given[0]} is for {other}, not {args.task}")
    out = Path(args.out)
    values = overrides.parse_pairs(args.overrides)
    if wrong := sorted(set(values) & NOT_FOR[args.task]):
        raise ConfigError(f"{', '.join(wrong)} does not apply to {args.task}")
    for flag, key in FLAG_SETTINGS[args.task].items():
        if key in values and given_options(args, (flag,)):
            raise ConfigError(f"{flag} and {key}= both say the same thing; give one")
    if args.task == "translation" and "tgt_vocab_size" in values:
        raise ConfigError("translation shares one vocabulary (vocab_size) between its two sides")
    if args.task == "classification":
        if "cls" in values:
            raise ConfigError("cls follows the pooling: set pooling=cls for a [CLS] token")
        if "n_classes" in values:
            raise ConfigError("n_classes follows the data's labels (labels=a,b,c names them)")
        if (args.valid or "valid_file" in values) and (
            args.valid_fraction is not None or "valid_fraction" in values
        ):
            raise ConfigError(
                "--valid-fraction holds out part of --train for validation; "
                "with --valid there is nothing to hold out"
            )
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is a file; --out names a directory for the run")
    created, had_lock, began = not out.exists(), (out / LOCK_FILE).exists(), False
    main = distributed.is_main()  # under torchrun, the one process that writes the run
    try:
        with contextlib.ExitStack() as lock:
            with distributed.main_first():  # rank 0 locks and checks; the others wait
                if main:
                    lock.enter_context(run_lock(out))  # checked under the lock: another
                    _check_new(out)  # process may be making it
            began = True
            return report_done(args.task, out, _train(args, out, values))
    except BaseException:
        if main and not (out / CONFIG_FILE).exists():  # no run saved: remove what this made
            if created:
                shutil.rmtree(out, ignore_errors=True)
            elif began:  # it was empty: everything in it is this run's
                for path in out.iterdir():
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        path.unlink(missing_ok=True)
            elif not had_lock:
                (out / LOCK_FILE).unlink(missing_ok=True)
        raise


def _check_new(out: Path) -> None:
    """Refuses an `--out` that holds a run, or other files."""
    if (out / CONFIG_FILE).exists():
        raise ConfigError(f"{out} already holds a run; continue it with --resume {out}")
    if foreign := sorted(path.name for path in out.iterdir() if path.name != LOCK_FILE):
        more = ", ..." if len(foreign) > 3 else ""
        raise ConfigError(
            f"{out} holds files and no run ({', '.join(foreign[:3])}{more}); give a new or "
            "empty directory (a run killed before it saved its settings leaves its tokenizer "
            "and cache: remove the directory to start it again)"
        )


def _train(args: argparse.Namespace, out: Path, values: dict[str, str]) -> Progress:
    """Trains a new run from the preset, the flags and the overrides."""
    from qkv import presets

    if args.task == "translation":
        from qkv.tasks.translation import TranslationData, train_translation

        model, train = presets.translation_preset(args.preset or "small")
        sides = {"src": args.src, "tgt": args.tgt}
        data = TranslationData(args.data or "", **{k: v for k, v in sides.items() if v is not None})
        data, model, train = overrides.apply_all(data, model, train, values)
        if not data.data_dir:
            raise ConfigError("train translation needs --data DIR")
        return train_translation(data, model, train, out, explicit=frozenset(values))
    from qkv.tasks.classification import found_fields, train_classification

    model, train, labelled = presets.classification_preset(args.preset or "strong")
    labelled.train_file, labelled.valid_file = args.train or "", args.valid or ""
    if args.valid_fraction is not None:
        labelled.valid_fraction = args.valid_fraction
    labelled, model, train = overrides.apply_all(labelled, model, train, values)
    if not labelled.train_file:
        raise ConfigError("train classification needs --train FILE")
    if note := found_fields(labelled, values):
        print(note)
    records = None
    if args.preset is None:  # read by the fields given (text_field=...), and read once
        records = labelled.read(labelled.train_file)
        examples = len(records[0])
        fitted = presets.fitted_classification(examples)
        fitted = {k: v for k, v in fitted.items() if k not in values}
        if fitted:
            settings = " ".join(f"{k}={v}" for k, v in fitted.items())
            print(f"no preset: strong, fitted to {examples:,} texts: {settings}")
            labelled, model, train = overrides.apply_all(labelled, model, train, fitted)
    return train_classification(
        labelled, model, train, out, explicit=frozenset(values), train_records=records
    )


BATCHING = ("max_tokens", "seed")
"""Training settings that make an epoch's batches (their sizes, their order)."""


def _resume(run_dir: Path, values: dict[str, str]) -> int:
    """Continues a run; training settings (threads, max_minutes, ...) may change, and so may
    the places of its data files, if they moved."""
    run = RunConfig.load(run_dir)
    with contextlib.ExitStack() as lock:
        with distributed.main_first():  # rank 0 locks the run; the others wait for it
            if distributed.is_main():
                lock.enter_context(run_lock(run_dir))
        for key in [key for key in values if key in DATA_PATHS and key in run.data]:
            if not run.data[key]:
                raise ConfigError(
                    f"{run_dir} was trained without a {key} (it held out part of its training "
                    f"file), so --resume cannot add one; to train on other data, start a new run"
                )
            run.data[key] = os.path.abspath(values.pop(key))
        for key in DATA_PATHS:
            place = run.data.get(key)
            if place and not Path(place).exists():
                raise ConfigError(
                    f"{run_dir}: its {key} {place} is gone; if the data moved, give its new "
                    f"place: qkv train --resume {run_dir} {key}=NEW"
                )
        before = run.train
        if run.task == "classification" and not run.data.get("valid_file"):
            run.data.setdefault("split_seed", before.seed)  # a run older than the setting
        run.train, rest = overrides.apply(run.train, values)
        known = [*run.data, *run.model.to_dict(), *run.train.to_dict()]
        if unknown := set(rest) - set(known):
            raise overrides.unknown_settings(unknown, known)
        if rest:
            raise ConfigError(
                "only training settings and the data's places can change when resuming, "
                f"not: {', '.join(sorted(rest))}"
            )
        if reordered := [k for k in BATCHING if getattr(run.train, k) != getattr(before, k)]:
            print(
                f"note: a new {' and '.join(reordered)} makes other batches: an epoch stopped "
                "part way goes on from the same batch number of the new ones, so some of its "
                "examples may be seen twice or not at all"
            )
        # The changes are saved once the data checks out: the same text, wherever it now is.
        if run.task == "translation":
            from qkv.tasks.translation import train_translation

            progress = train_translation(None, None, None, run_dir, resume=run)
        else:
            from qkv.tasks.classification import train_classification

            progress = train_classification(None, None, None, run_dir, resume=run)
    return report_done(run.task, run_dir, progress)


def report_done(task: str, run_dir: Path, progress: Progress) -> int:
    """Prints where a finished run is, its best score and how to use it; returns exit code 0."""
    best = f"bleu {progress.best:.2f}" if task == "translation" else f"accuracy {progress.best:.4f}"
    verb = "translate" if task == "translation" else "classify"
    print(f"done: {run_dir} (best {best} at step {progress.best_step})")
    print(f"{verb} with: qkv {verb} {run_dir} --input FILE")
    return 0
