"""`qkv evaluate`: BLEU/chrF for translation runs, accuracy/F1 for classification runs."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

from qkv.cli import decode_options, device_name, given_options, print_json
from qkv.errors import ConfigError
from qkv.run import RunConfig

TASK_OPTIONS = {
    "translation": (
        *("--src", "--ref", "--beam", "--alpha", "--max-len-a", "--max-len-b", "--workers"),
        *("--bf16", "--engine", "--quantize"),
    ),
    "classification": ("--data", "--text-field", "--label-field"),
}
"""The options of `qkv evaluate` that belong to each task."""


def run(args: argparse.Namespace) -> int:
    task = RunConfig.load(Path(args.run_dir)).task
    for other, options in TASK_OPTIONS.items():
        if other != task and (given := given_options(args, options)):
            raise ConfigError(f"{given[0]} is for {other} runs; {args.run_dir} is a {task} run")
    if task == "translation":
        return _translation(args)
    from qkv.commands.classify import evaluate_classification

    return evaluate_classification(args)


def _translation(args: argparse.Namespace) -> int:
    from qkv.data.readers import read_parallel
    from qkv.evaluation.bleu import score_translations
    from qkv.inference.translator import Translator
    from qkv.training.speed import tune_allocator

    if not args.src or not args.ref:
        raise ConfigError("evaluate on a translation run needs --src FILE and --ref FILE")
    sources, references = read_parallel(Path(args.src), Path(args.ref))
    tune_allocator()  # decoding allocates the same large blocks every step
    translator = Translator.load(args.run_dir, device_name(args), args.engine, args.quantize)
    hypotheses = translator.translate(sources, progress=True, **decode_options(args))
    scores = score_translations(hypotheses, references)
    if args.json:
        settings = ("beam", "alpha", "bf16", "max_len_a", "max_len_b", "engine", "quantize")
        print_json({**{key: getattr(args, key) for key in settings}, **asdict(scores)})
    else:
        print(f"BLEU {scores.bleu:.2f}  ({scores.bleu_signature})")
        print(f"chrF {scores.chrf:.2f}  ({scores.chrf_signature})")
        print(
            f"BLEU, lowercased tokens (secondary, as tutorials report): {scores.bleu_lowercase:.2f}"
        )
    return 0
