"""`qkv translate`: stdin (or a file) to stdout (or a file), one sentence per line."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from qkv.cli import decode_options, device_name, given_options
from qkv.commands.io import check_output, file_named, input_chunks, json_line, output_lines
from qkv.data.lines import count_lines
from qkv.errors import ConfigError

if TYPE_CHECKING:
    from qkv.inference.translator import Hypothesis

CHUNK_LINES = 16384  # lines read, translated and written at a time (sorted by length within)
SEARCH_OPTIONS = ("--beam", "--alpha")
SAMPLING_OPTIONS = ("--temperature", "--top-k", "--top-p", "--seed")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from qkv.inference.translator import Translator
    from qkv.training.speed import tune_allocator

    unused = SEARCH_OPTIONS if args.sample else SAMPLING_OPTIONS
    if given := given_options(args, unused):
        raise ConfigError(
            f"{given[0]} is for beam search, which --sample replaces"
            if args.sample
            else f"{given[0]} is for --sample; without it qkv searches (--beam)"
        )
    if args.n_best > 1 and not args.json:
        raise ConfigError("--n-best needs --json (one JSON object a line holds the hypotheses)")
    tune_allocator()  # decoding allocates the same large blocks every step
    check_output(args.output, args.input)  # before the work, not after
    translator = Translator.load(args.run_dir, device_name(args), args.engine, args.quantize)
    options = decode_options(args, sampling=True)
    # A chunk of lines at a time: an input of any length takes the same memory.
    bar = tqdm(unit="sent", disable=None, leave=False)  # on a terminal's stderr
    source = file_named(args.input)
    if not bar.disable and source and Path(source).is_file():  # not a pipe: it reads once
        bar.reset(total=count_lines(source))
    with output_lines(args.output) as write, bar:
        start = 0
        for lines in input_chunks(args.input, CHUNK_LINES):
            found = translator.hypotheses(
                lines,
                n_best=args.n_best,
                scored=args.json,
                progress=bar.update,
                start=start,
                **options,
            )
            if args.json:
                pairs = zip(lines, found, strict=True)
                write([json_line(_record(line, h)) for line, h in pairs])
            else:
                write([hypotheses[0].text for hypotheses in found])
            start += len(lines)
    return 0


def _record(source: str, hypotheses: list[Hypothesis]) -> dict[str, object]:
    return {
        "source": source,
        "hypotheses": [{"text": h.text, "score": h.score, "tokens": h.tokens} for h in hypotheses],
    }
