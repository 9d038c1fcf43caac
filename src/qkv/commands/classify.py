"""`qkv classify` and `qkv evaluate` for classification runs."""

from __future__ import annotations

import argparse
import sys
import unicodedata
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path

from qkv.cli import device_name, print_json
from qkv.commands.io import check_output, file_named, input_chunks, json_line, output_lines
from qkv.data.readers import holds_records, is_blank, read_texts
from qkv.errors import ConfigError, DataError

FIELD_FLAGS = ("--text-field NAME", "--label-field NAME")  # how the commands name other fields
CHUNK_TEXTS = 2048  # texts classified and written at a time (some 70 KB each meanwhile)


def run(args: argparse.Namespace) -> int:
    from qkv.inference.classifier import Classifier

    source = file_named(args.input)
    if args.text_field and (source is None or not holds_records(source)):
        where = source or "stdin"
        raise ConfigError(
            f"--text-field names a field of records, and {where} is read as lines of text: "
            "give a file named .jsonl, .csv or .tsv"
        )
    check_output(args.output, args.input)  # before the work, not after
    classifier = Classifier.load(args.run_dir, device_name(args))
    field = args.text_field or classifier.data.text_field
    with output_lines(args.output) as write:
        for number, texts in enumerate(_text_chunks(source, field)):
            if number == 0 and texts[0].strip().startswith("{") and texts[0].strip().endswith("}"):
                print(
                    "warning: the first text looks like a JSON object, and is classified "
                    "whole; an --input file named .jsonl gives its records' text field",
                    file=sys.stderr,
                )
            found = zip(texts, classifier.predict(texts), strict=True)
            write([_line(text, label, prob, args.json) for text, (label, prob) in found])
    return 0


def _line(text: str, label: str, probability: float, as_json: bool) -> str:
    if as_json:
        return json_line({"label": label, "probability": round(probability, 6), "text": text})
    return f"{label}\t{probability:.4f}"


def _text_chunks(source: str | None, field: str) -> Iterator[list[str]]:
    """The texts to classify, `CHUNK_TEXTS` at a time: the `field` of each record of a JSON
    Lines, CSV or TSV file (read whole: a CSV record may span lines), or the lines of another
    file or of stdin (`source` None), read a chunk at a time; a blank text is a DataError."""
    from qkv.tasks.classification import clean_text

    if source and holds_records(source):
        texts = read_texts(Path(source), text_field=field, clean=clean_text, hint=FIELD_FLAGS[0])
        yield from (texts[i : i + CHUNK_TEXTS] for i in range(0, len(texts), CHUNK_TEXTS))
        return
    first = 1  # the number of the chunk's first line
    for lines in input_chunks(source, CHUNK_TEXTS):
        if empty := [i for i, text in enumerate(lines) if is_blank(clean_text(text))]:
            problem = "empty text (nothing but spaces or line breaks)"
            raise DataError(source or "<stdin>", problem, first + empty[0])
        yield lines
        first += len(lines)


def evaluate_classification(args: argparse.Namespace) -> int:
    from qkv.evaluation.classification import score_classification
    from qkv.inference.classifier import Classifier

    if not args.data:
        raise ConfigError("evaluate on a classification run needs --data FILE")
    classifier = Classifier.load(args.run_dir, device_name(args))
    index = {name: i for i, name in enumerate(classifier.labels)}
    fields = {"text_field": args.text_field, "label_field": args.label_field}
    data = replace(classifier.data, **{name: value for name, value in fields.items() if value})
    texts, gold = data.read(args.data, index, hints=FIELD_FLAGS)
    predicted = classifier.probabilities(texts).argmax(-1).tolist()
    scores = score_classification([index[g] for g in gold], predicted, classifier.labels)
    if args.json:
        print_json(asdict(scores))
        return 0
    print(
        f"accuracy {scores.accuracy:.4f}  macro-F1 {scores.macro_f1:.4f}  "
        f"({scores.examples} examples)"
    )
    print("confusion (rows: true, columns: predicted)")
    print("\n".join(confusion_lines(scores.labels, scores.confusion)))
    return 0


def confusion_lines(labels: list[str], confusion: list[list[int]]) -> list[str]:
    """The confusion matrix as terminal lines: a header of labels, then a row per true label,
    aligned by display width (see `display_width`)."""
    cells = [*labels, *(str(count) for row in confusion for count in row)]
    width = max(display_width(cell) for cell in cells)

    def right(cell: str) -> str:
        return " " * (width - display_width(cell)) + cell

    lines = [" " * width + "  " + "  ".join(right(label) for label in labels)]
    for name, row in zip(labels, confusion, strict=True):
        lines.append(right(name) + "  " + "  ".join(right(str(count)) for count in row))
    return lines


def display_width(text: str) -> int:
    """Columns `text` takes on a terminal: two for wide characters (CJK, emoji), none for
    combining marks and joiners."""
    width = 0
    for char in text:
        if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me", "Cf"):
            continue  # accents, variation selectors, zero-width joiners
        width += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return width
