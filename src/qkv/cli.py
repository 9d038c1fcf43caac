"""The `qkv` command line: parse arguments, call the library, report errors in one line."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from qkv import __version__
from qkv.errors import QkvError, os_problem
from qkv.export import QUANTIZATIONS
from qkv.training.signals import sigterm_as_ctrl_c


class _Parser(argparse.ArgumentParser):
    """An `ArgumentParser` that ends an option's help with "(default X)", unless it is a flag,
    has no default or says it itself (through public API: argparse's formatters are not)."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        text, default = action.help or "", action.default
        if action.nargs != 0 and default not in (None, argparse.SUPPRESS) and "default" not in text:
            action.help = f"{text} (default %(default)s)"
        return action


def _command(
    sub: argparse._SubParsersAction, name: str, help: str, run_dir: bool = True, epilog: str = ""
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
    text = "auto (a GPU when torch sees one, else the CPU), cpu, cuda or cuda:N"
    if workers:
        text += "; with --workers above 1, auto is the CPU"
    parser.add_argument("--device", default="auto", help=text)


def _add_engine(parser: argparse.ArgumentParser) -> None:
    text = "translation: decode with PyTorch, or with the run's CTranslate2 export, made on first "
    text += "use (pip install 'qkv[deploy]'; default %(default)s)"
    parser.add_argument("--engine", choices=("torch", "ctranslate2"), default="torch", help=text)
    text = "with --engine ctranslate2: the export's weights (default float32)"
    parser.add_argument("--quantize", choices=QUANTIZATIONS, help=text)


def _add_decoding(parser: argparse.ArgumentParser, sampling: bool = False) -> None:
    """The options of translating: search (and with `sampling`, sampling), length and speed."""
    _add_engine(parser)
    add = parser.add_argument
    add("--beam", type=int, default=5, help="beam size, 1 = greedy")
    add("--alpha", type=float, default=0.6, help="GNMT length penalty exponent")
    if sampling:
        add("--sample", action="store_true", help="sample instead of searching")
        add("--temperature", type=float, default=1.0, help="--sample: divides the logits")
        text = "--sample: draw from the K likeliest tokens (default %(default)s: all)"
        add("--top-k", type=int, default=0, metavar="K", help=text)
        text = "--sample: draw from the fewest likeliest tokens whose probability reaches P "
        text += "(default %(default)s: all)"
        add("--top-p", type=float, default=1.0, metavar="P", help=text)
        add("--seed", type=int, default=0, help="random seed of --sample")
        text = "on a GPU, launch every kernel of decoding and search from Python (default: "
        text += "replay each step of the model and the search as one CUDA graph)"
        add("--no-cuda-graphs", action="store_true", help=text)
    text = "an output stops after A x its source's tokens + B tokens, and within the model's "
    text += "positions"
    add("--max-len-a", type=float, default=1.5, metavar="A", help=text)
    add("--max-len-b", type=int, default=10, metavar="B", help="see --max-len-a")
    _add_device(parser, workers=True)
    text = "translation on a CPU: decode N batches at once, each in a thread of its own; 0 is "
    text += "one per torch thread, up to 4, for greedy search and sampling, and 1 for beam search"
    add("--workers", type=int, default=0, metavar="N", help=text)
    text = "translation: decode a bfloat16 copy of the model (faster on GPUs and on CPUs with "
    text += "AVX512-BF16 or AMX; outputs may differ slightly from float32)"
    add("--bf16", action="store_true", help=text)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="qkv",
        description="The Transformer of 'Attention Is All You Need': train, run, look inside.",
    )
    parser.add_argument("--version", action="version", version=f"qkv {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    epilog = "Any data, model or training field can be set as key=value, e.g. d_model=256."
    text = "train a model into a run directory"
    add = _command(sub, "train", text, run_dir=False, epilog=epilog).add_argument
    add("task", nargs="?", help="translation or classification")
    add("--resume", metavar="RUN", help="continue the run in RUN exactly")
    add("--out", metavar="RUN", help="run directory to create")
    text = "named configuration to start from (default small for translation; for "
    text += "classification strong, fitted to the data's size)"
    add("--preset", help=text)
    add("--data", metavar="DIR", help="translation: train/val files live here")
    add("--src", help="translation: source language suffix (default de)")
    add("--tgt", help="translation: target language suffix (default en)")
    add("--train", metavar="FILE", help="classification: labelled training file")
    add("--valid", metavar="FILE", help="classification: labelled validation file")
    text = "classification: share of --train held out when --valid is absent (default 0.1)"
    add("--valid-fraction", type=float, help=text)

    translate = _command(sub, "translate", "translate text with a trained run")
    _add_decoding(translate, sampling=True)
    add = translate.add_argument
    add("--input", metavar="FILE", help="one sentence per line (default stdin)")
    add("--output", metavar="FILE", help="default stdout")
    text = "with --json: the N best hypotheses of each sentence, N up to --beam (default 1)"
    add("--n-best", type=int, default=1, metavar="N", help=text)
    text = "one JSON object a line: the hypotheses with their scores and tokens"
    add("--json", action="store_true", help=text)

    evaluate = _command(sub, "evaluate", "score a run on a test set")
    add = evaluate.add_argument
    add("--src", metavar="FILE", help="translation: source sentences")
    add("--ref", metavar="FILE", help="translation: reference translations")
    add("--data", metavar="FILE", help="classification: labelled file")
    text = "classification: the text column or key of --data (the run's, 'text' by default)"
    add("--text-field", metavar="NAME", help=text)
    add("--label-field", metavar="NAME", help="classification: the label column or key (ditto)")
    _add_decoding(evaluate)
    add("--json", action="store_true", help="print one JSON object")

    classify = _command(sub, "classify", "label texts with a trained classification run")
    add = classify.add_argument
    text = "one text per line, or JSONL / CSV / TSV with the run's text field"
    add("--input", metavar="FILE", help=text)
    add("--text-field", metavar="NAME", help="the text column or key of --input (the run's)")
    add("--output", metavar="FILE", help="default stdout")
    add("--json", action="store_true", help="one JSON object per line")
    _add_device(classify)

    text = "train a small model on dates in a minute, with pictures"
    add = _command(sub, "demo", text, run_dir=False).add_argument
    add("--out", metavar="DIR", default="qkv-demo", help="where to write the run")
    add("--minutes", type=float, default=1.0, help="training time budget in minutes")
    add("--seed", type=int, default=1, help="random seed")

    add = _command(sub, "attention", "draw the attention maps of one input").add_argument
    add("sentence", help="source sentence (translation) or text (classification)")
    add("--out", metavar="FILE.png", required=True, help="picture to write (.png, .svg, .pdf, ...)")
    text = "comma-separated: encoder self, decoder self, cross (default all three)"
    add("--kinds", default="encoder self,decoder self,cross", help=text)
    add("--layers", help="comma-separated 0-based layers (default all)")
    add("--heads", help="comma-separated 0-based heads (default all)")

    add = _command(sub, "export", "convert a translation run for an inference engine").add_argument
    add("--to", choices=("ctranslate2",), required=True, help="the engine")
    add("out", metavar="OUT", help="the model directory to write")
    add("--quantize", choices=QUANTIZATIONS, help="weights (default float32)")

    serve = _command(sub, "serve", "serve runs over HTTP, with a web page", run_dir=False)
    add = serve.add_argument
    add("runs", metavar="RUN", nargs="+", help="run directories to serve")
    add("--host", default="127.0.0.1", help="address")
    add("--port", type=int, default=8000, help="port")
    _add_engine(serve)
    add("--threads", type=int, default=0, help="torch threads (0: its default)")
    text = "how long a batch gathers concurrent requests"
    add("--window-ms", type=float, default=10.0, help=text)
    text = "source tokens a gathered batch holds at most"
    add("--batch-tokens", type=int, default=8192, help=text)
    add("--max-texts", type=int, default=64, help="texts a request")
    add("--max-chars", type=int, default=2000, help="characters a text")
    add("--max-body", type=int, default=1 << 20, help="bytes a body (default 1 MiB)")

    add = _command(sub, "plot", "draw a run's training and validation curves").add_argument
    text = "picture to write (.png, .svg, .pdf, ...; default RUN/curves.png)"
    add("--out", metavar="FILE.png", help=text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if sys.stderr is None:  # started with stderr closed (2>&-): its messages go nowhere
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (for the process)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    pairs = [item for item in extra if "=" in item and not item.startswith("-")]
    if unknown := [item for item in extra if not (args.command == "train" and item in pairs)]:
        reads_input = args.command in ("translate", "classify")  # from --input FILE or stdin
        reads_input = reads_input and any(not item.startswith("-") for item in unknown)
        hint = " (give an input file with --input FILE)" if reads_input else ""
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    args.overrides = pairs
    if not getattr(args, "run", None):
        parser.print_help()
        return 0
    warnings.formatwarning = lambda message, *_a, **_k: f"warning: {message}\n"
    # SIGTERM stops a command as Ctrl-C does (`qkv serve` has its own way, which drains).
    stopping = contextlib.nullcontext() if args.command == "serve" else sigterm_as_ctrl_c()
    try:
        with stopping:
            return int(args.run(args))
    except QkvError as error:
        from qkv.training.trainer import TrainingInterrupted

        _say(f"qkv: {error}")
        return 130 if isinstance(error, TrainingInterrupted) else 2
    except KeyboardInterrupt:
        _say("qkv: interrupted")
        return 130
    except BrokenPipeError:  # the reader of stdout went away (`| head`)
        if args.command == "train":  # training had not begun (once begun, it stops itself)
            _say("qkv: stdout closed before training began")
            return 130
        return 0
    except OSError as error:  # a path the user named cannot be made, read or written
        _say(f"qkv: {os_problem(error)}")
        return 2


def _say(line: str) -> None:
    """A last line on stderr, unless its reader has gone too (`qkv train 2>&1 | head`)."""
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


def given_options(args: argparse.Namespace, flags: Sequence[str]) -> list[str]:
    """Those of `flags` ("--top-k", or "task" for a positional) that the command line set to
    other than their defaults."""
    dests = {flag: flag.removeprefix("--").replace("-", "_") for flag in flags}
    return [flag for flag, dest in dests.items() if getattr(args, dest) != args.default(dest)]


def device_name(args: argparse.Namespace) -> str:
    """--device, with auto meaning the CPU when --workers is above 1."""
    if args.device == "auto" and getattr(args, "workers", 0) > 1:
        return "cpu"
    return str(args.device)


def decode_options(args: argparse.Namespace, sampling: bool = False) -> dict[str, Any]:
    """The keywords of `Translator.translate` that the options of `_add_decoding` set."""
    from qkv.inference.translate import SAMPLING_FIELDS

    options = {name: getattr(args, name) for name in ("max_len_a", "max_len_b", "workers", "bf16")}
    if sampling:
        options.update(sampling=args.sample, cuda_graphs=not args.no_cuda_graphs)
    if sampling and args.sample:
        options.update({name: getattr(args, name) for name in SAMPLING_FIELDS})
    else:
        options.update(beam_size=args.beam, alpha=args.alpha)
    return options


def print_json(data: object) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    sys.exit(main())
