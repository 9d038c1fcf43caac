"""The `qkv` command line: parse arguments, call the library, report errors in one line."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import warnings
from collections.abc import Sequence

from qkv import __version__
from qkv.errors import QkvError, os_problem
from qkv.export import QUANTIZATIONS


def _command(
    sub: argparse._SubParsersAction,
    name: str,
    help: str,
    run_dir: bool = True,
    epilog: str | None = None,
) -> argparse.ArgumentParser:
    """The parser of `qkv NAME`, whose runner imports `qkv.commands.NAME` only when run, so
    that `qkv --help` stays fast."""

    def run(args: argparse.Namespace) -> int:
        return int(importlib.import_module(f"qkv.commands.{name}").run(args))

    parser = sub.add_parser(name, help=help, epilog=epilog)
    parser.set_defaults(run=run, default=parser.get_default)
    if run_dir:
        parser.add_argument("run_dir", metavar="RUN")
    return parser


def _add_device(parser: argparse.ArgumentParser, workers: bool = False) -> None:
    note = "; with --workers above 1, auto is the CPU" if workers else ""
    parser.add_argument(
        "--device",
        default="auto",
        help=f"auto (a GPU when torch sees one, else the CPU), cpu, cuda or cuda:N{note} "
        "(default %(default)s)",
    )


def _add_engine(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine",
        choices=("torch", "ctranslate2"),
        default="torch",
        help="translation: decode with PyTorch, or with the run's CTranslate2 export, made on "
        "first use (pip install 'qkv[deploy]'; default %(default)s)",
    )
    parser.add_argument(
        "--quantize",
        choices=QUANTIZATIONS,
        help="with --engine ctranslate2: the export's weights (default float32)",
    )


def _add_decoding(parser: argparse.ArgumentParser, sampling: bool = False) -> None:
    """The options of translating: search (and with `sampling`, sampling), length and speed."""
    _add_engine(parser)
    parser.add_argument(
        "--beam", type=int, default=5, help="beam size, 1 = greedy (default %(default)s)"
    )
    parser.add_argument(
        "--alpha",
        type=float,
        default=0.6,
        help="GNMT length penalty exponent (default %(default)s)",
    )
    if sampling:
        parser.add_argument("--sample", action="store_true", help="sample instead of searching")
        parser.add_argument(
            "--temperature",
            type=float,
            default=1.0,
            help="--sample: divides the logits (default %(default)s)",
        )
        parser.add_argument(
            "--top-k",
            type=int,
            default=0,
            metavar="K",
            help="--sample: draw from the K likeliest tokens (default %(default)s: all)",
        )
        parser.add_argument(
            "--top-p",
            type=float,
            default=1.0,
            metavar="P",
            help="--sample: draw from the fewest likeliest tokens whose probability reaches P "
            "(default %(default)s: all)",
        )
        parser.add_argument(
            "--seed", type=int, default=0, help="random seed of --sample (default %(default)s)"
        )
        parser.add_argument(
            "--no-cuda-graphs",
            action="store_true",
            help="on a GPU, launch every kernel of decoding and search from Python (default: "
            "replay each step of the model and the search as one CUDA graph)",
        )
    parser.add_argument(
        "--max-len-a",
        type=float,
        default=1.5,
        metavar="A",
        help="an output stops after A x its source's tokens + B tokens, and within the "
        "model's positions (default %(default)s)",
    )
    parser.add_argument(
        "--max-len-b",
        type=int,
        default=10,
        metavar="B",
        help="see --max-len-a (default %(default)s)",
    )
    _add_device(parser, workers=True)
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        metavar="N",
        help="translation on a CPU: decode N batches at once, each in a thread of its own; "
        "0 is one per torch thread, up to 4, for greedy search and sampling, and 1 for beam "
        "search (default %(default)s)",
    )
    parser.add_argument(
        "--bf16",
        action="store_true",
        help="translation: decode a bfloat16 copy of the model (faster on GPUs and on CPUs with "
        "AVX512-BF16 or AMX; outputs may differ slightly from float32)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qkv",
        description="The Transformer of 'Attention Is All You Need': train, run, look inside.",
    )
    parser.add_argument("--version", action="version", version=f"qkv {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    train = _command(
        sub,
        "train",
        "train a model into a run directory",
        run_dir=False,
        epilog="Any data, model or training field can be set as key=value, e.g. d_model=256.",
    )
    train.add_argument("task", nargs="?", help="translation or classification")
    train.set_defaults(accepts_overrides=True)
    train.add_argument("--resume", metavar="RUN", help="continue the run in RUN exactly")
    train.add_argument("--out", metavar="RUN", help="run directory to create")
    train.add_argument("--preset", help="named configuration to start from")
    train.add_argument("--data", metavar="DIR", help="translation: train/val files live here")
    train.add_argument("--src", help="translation: source language suffix (default de)")
    train.add_argument("--tgt", help="translation: target language suffix (default en)")
    train.add_argument("--train", metavar="FILE", help="classification: labelled training file")
    train.add_argument("--valid", metavar="FILE", help="classification: labelled validation file")
    train.add_argument(
        "--valid-fraction",
        type=float,
        help="classification: share of --train held out when --valid is absent (default 0.1)",
    )

    translate = _command(sub, "translate", "translate text with a trained run")
    _add_decoding(translate, sampling=True)
    translate.add_argument("--input", metavar="FILE", help="one sentence per line (default stdin)")
    translate.add_argument("--output", metavar="FILE", help="default stdout")
    translate.add_argument(
        "--n-best",
        type=int,
        default=1,
        metavar="N",
        help="with --json: the N best hypotheses of each sentence, N up to --beam (default 1)",
    )
    translate.add_argument(
        "--json",
        action="store_true",
        help="one JSON object a line: the hypotheses with their scores and tokens",
    )

    evaluate = _command(sub, "evaluate", "score a run on a test set")
    evaluate.add_argument("--src", metavar="FILE", help="translation: source sentences")
    evaluate.add_argument("--ref", metavar="FILE", help="translation: reference translations")
    evaluate.add_argument("--data", metavar="FILE", help="classification: labelled file")
    _add_decoding(evaluate)
    evaluate.add_argument("--json", action="store_true", help="print one JSON object")

    classify = _command(sub, "classify", "label texts with a trained classification run")
    classify.add_argument(
        "--input",
        metavar="FILE",
        help="one text per line, or JSONL / CSV / TSV with the run's text field",
    )
    classify.add_argument("--json", action="store_true", help="one JSON object per line")
    _add_device(classify)

    demo = _command(
        sub, "demo", "train a small model on dates in a minute, with pictures", run_dir=False
    )
    demo.add_argument(
        "--out",
        metavar="DIR",
        default="qkv-demo",
        help="where to write the run (default %(default)s)",
    )
    demo.add_argument(
        "--minutes",
        type=float,
        default=1.0,
        help="training time budget in minutes (default %(default)s)",
    )
    demo.add_argument("--seed", type=int, default=1, help="random seed (default %(default)s)")

    attention = _command(sub, "attention", "draw the attention maps of one input")
    attention.add_argument(
        "sentence", help="source sentence (translation) or text (classification)"
    )
    attention.add_argument(
        "--out", metavar="FILE.png", required=True, help="picture to write (.png, .svg, .pdf, ...)"
    )
    attention.add_argument(
        "--kinds",
        default="encoder self,decoder self,cross",
        help="comma-separated: encoder self, decoder self, cross (default all three)",
    )
    attention.add_argument("--layers", help="comma-separated 0-based layers (default all)")
    attention.add_argument("--heads", help="comma-separated 0-based heads (default all)")

    export = _command(sub, "export", "convert a translation run for an inference engine")
    export.add_argument("--to", choices=("ctranslate2",), required=True, help="the engine")
    export.add_argument("out", metavar="OUT", help="the model directory to write")
    export.add_argument("--quantize", choices=QUANTIZATIONS, help="weights (default float32)")

    serve = _command(sub, "serve", "serve runs over HTTP, with a web page", run_dir=False)
    serve.add_argument("runs", metavar="RUN", nargs="+", help="run directories to serve")
    serve.add_argument("--host", default="127.0.0.1", help="address (default %(default)s)")
    serve.add_argument("--port", type=int, default=8000, help="port (default %(default)s)")
    _add_engine(serve)
    serve.add_argument("--threads", type=int, default=0, help="torch threads (0: its default)")
    serve.add_argument(
        "--window-ms",
        type=float,
        default=10.0,
        help="how long a batch gathers concurrent requests (default %(default)s)",
    )
    serve.add_argument(
        "--batch-tokens",
        type=int,
        default=8192,
        help="source tokens a gathered batch holds at most (default %(default)s)",
    )
    serve.add_argument("--max-texts", type=int, default=64, help="texts a request (64)")
    serve.add_argument("--max-chars", type=int, default=2000, help="characters a text (2000)")
    serve.add_argument("--max-body", type=int, default=1 << 20, help="bytes a body (1 MiB)")

    plot = _command(sub, "plot", "draw a run's training and validation curves")
    plot.add_argument(
        "--out",
        metavar="FILE.png",
        help="picture to write (.png, .svg, .pdf, ...; default RUN/curves.png)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if sys.stderr is None:  # started with stderr closed (2>&-): its messages go nowhere
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (for the process)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    accepts_overrides = getattr(args, "accepts_overrides", False)
    pairs = [item for item in extra if "=" in item and not item.startswith("-")]
    if len(pairs) < len(extra) or (pairs and not accepts_overrides):
        reads_input = args.command in ("translate", "classify")  # from --input FILE or stdin
        hint = " (give an input file with --input FILE)" if reads_input else ""
        unknown = [item for item in extra if not (accepts_overrides and item in pairs)]
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    args.overrides = pairs
    if not getattr(args, "run", None):
        parser.print_help()
        return 0
    warnings.formatwarning = lambda message, *_a, **_k: f"warning: {message}\n"
    try:
        return int(args.run(args))
    except QkvError as error:
        from qkv.training.trainer import TrainingInterrupted

        print(f"qkv: {error}", file=sys.stderr)
        return 130 if isinstance(error, TrainingInterrupted) else 2
    except KeyboardInterrupt:
        print("qkv: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away (`| head`)
        if args.command == "train":  # training had not begun (once begun, it stops itself)
            print("qkv: stdout closed before training began", file=sys.stderr)
            return 130
        return 0
    except OSError as error:  # a path the user named cannot be made, read or written
        print(f"qkv: {os_problem(error)}", file=sys.stderr)
        return 2


def given_options(args: argparse.Namespace, dests: Sequence[str]) -> list[str]:
    """The flags ("--top-k") of the options `dests` ("top_k") that the command line set to
    other than their defaults."""
    return [
        "--" + dest.replace("_", "-") for dest in dests if getattr(args, dest) != args.default(dest)
    ]


def device_name(args: argparse.Namespace) -> str:
    """--device, with auto meaning the CPU when --workers is above 1."""
    if args.device == "auto" and getattr(args, "workers", 0) > 1:
        return "cpu"
    return str(args.device)


def print_json(data: object) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    sys.exit(main())
