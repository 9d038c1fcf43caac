"""`qkv classify` and `qkv evaluate` for classification runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from qkv.cli import device_name, print_json
from qkv.commands.io import check_output, input_lines
from qkv.data.readers import is_blank, read_texts
from qkv.errors import ConfigError, DataError


def run(args: argparse.Namespace) -> int:
    from qkv.inference.classifier import Classifier
    from qkv.tasks.classification import clean_text

    check_output(None)  # stdout open
    classifier = Classifier.load(args.run_dir, device_name(args))
    if args.input:
        field = classifier.data.text_field
        texts = read_texts(Path(args.input), text_field=field, clean=clean_text)
    else:
        texts = input_lines(None)
        empty = [i + 1 for i, t in enumerate(texts) if is_blank(clean_text(t))]
        if empty:
            raise DataError("<stdin>", "empty text (nothing but spaces or line breaks)", empty[0])
    for text, (label, prob) in zip(texts, classifier.predict(texts), strict=True):
        if args.json:
            print(
                json.dumps(
                    {"label": label, "probability": round(prob, 6), "text": text},
                    ensure_ascii=False,
                )
            )
        else:
            print(f"{label}\t{prob:.4f}")
    return 0


def evaluate_classification(args: argparse.Namespace) -> int:
    from qkv.evaluation.classification import score_classification
    from qkv.inference.classifier import Classifier

    if not args.data:
        raise ConfigError("evaluate on a classification run needs --data FILE")
    classifier = Classifier.load(args.run_dir, device_name(args))
    data = classifier.data
    index = {name: i for i, name in enumerate(classifier.labels)}
    texts, gold = data.read(args.data, known_labels=index)
    predicted = classifier.probabilities(texts).argmax(-1).tolist()
    scores = score_classification([index[g] for g in gold], predicted, classifier.labels)
    if args.json:
        print_json(scores.to_dict())
        return 0
    print(
        f"accuracy {scores.accuracy:.4f}  macro-F1 {scores.macro_f1:.4f}  "
        f"({scores.examples} examples)"
    )
    cells = [*scores.labels, *(str(count) for row in scores.confusion for count in row)]
    width = max(len(cell) for cell in cells)
    print("confusion (rows: true, columns: predicted)")
    print(" " * width + "  " + "  ".join(f"{x:>{width}}" for x in scores.labels))
    for name, row in zip(scores.labels, scores.confusion, strict=True):
        print(f"{name:>{width}}  " + "  ".join(f"{v:>{width}}" for v in row))
    return 0
