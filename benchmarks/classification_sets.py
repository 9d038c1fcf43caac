"""Classification data sets made from IMDB, to try a run's defaults on data nobody tuned for.

    python benchmarks/classification_sets.py OUT [--imdb ../shared/data/imdb]

Writes JSONL files (`text`, `label`) under OUT, each a training file and its test file:

| set | training | test |
|---|---|---|
| `imdb1k`, `imdb5k` | 1,000 / 5,000 training reviews | `imdb.test5k`: 5,000 test reviews |
| `first` | 7,000 first sentences of 3 words or more | the same of the 5,000 |
| `last` | the last sentence of 3 words or more of 7,000 reviews | the same of the 5,000 |
| `multi` | 7,000 reviews, 4 labels from the rating (1-2, 3-4, 7-8, 9-10) | the 5,000, the same |
| `noisy5k` | `imdb5k` with a fifth of its labels flipped | `imdb.test5k` |
| `short` | every training review of 100 words or fewer (3,085) | every such test review (3,246) |

Then, for instance:

    qkv train classification --train OUT/first.train.jsonl --out runs/first
    qkv evaluate runs/first --data OUT/first.test.jsonl

`--linear` prints, for each set, the test accuracy of a linear reference model instead:
logistic regression (C 4) on TF-IDF word unigrams and bigrams (sublinear term counts, seen in
at least two texts), what a trained classifier should be measured against. It needs
scikit-learn, which qkv does not depend on (`pip install scikit-learn`).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
from pathlib import Path
from typing import Any

SHORT_WORDS = 100  # the `short` set's longest review, in words
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
RATING_CLASSES = {1: "awful", 2: "awful", 3: "poor", 4: "poor"} | {
    7: "good",
    8: "good",
    9: "great",
    10: "great",
}


def load(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def clean(text: str) -> str:
    """The text with IMDB's line breaks (`<br />`) as spaces."""
    return re.sub(r"<br\s*/?>", " ", text)


def sentences(text: str) -> list[str]:
    return SENTENCE_END.split(clean(text).strip())


def first(text: str) -> str:
    return sentences(text)[0]


def last(text: str) -> str:
    """The last sentence of 3 words or more (the whole text if none)."""
    found = [s for s in sentences(text) if len(s.split()) >= 3]
    return found[-1] if found else text


def words(text: str) -> int:
    return len(clean(text).split())


def write(path: Path, rows: list[dict[str, str]]) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    print(f"{path}: {len(rows):,} rows")


SETS = {  # training file -> test file
    "imdb1k": "imdb.test5k",
    "imdb5k": "imdb.test5k",
    "first": "first.test",
    "last": "last.test",
    "multi": "multi.test",
    "noisy5k": "imdb.test5k",
    "short": "short.test",
}


def linear_reference(out: Path) -> None:
    """Print each set's test accuracy of TF-IDF logistic regression (see the module's text)."""
    try:
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
    except ImportError:
        raise SystemExit("--linear needs scikit-learn: pip install scikit-learn") from None

    def read(name: str) -> tuple[list[str], list[str]]:
        with (out / f"{name}.jsonl").open(encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle]
        return [r["text"] for r in rows], [r["label"] for r in rows]

    for train, test in SETS.items():
        texts, labels = read(f"{train}.train")
        test_texts, test_labels = read(test)
        features = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True)
        model = LogisticRegression(C=4, max_iter=2000)
        model.fit(features.fit_transform(texts), labels)
        print(f"{train}: {model.score(features.transform(test_texts), test_labels):.2%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--imdb", type=Path, default=Path("../shared/data/imdb"))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--linear", action="store_true", help="the linear reference's accuracy")
    args = parser.parse_args()
    if args.linear:
        linear_reference(args.out)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    train, test = load(args.imdb / "train.jsonl.gz"), load(args.imdb / "test.jsonl.gz")
    rng.shuffle(train)
    rng.shuffle(test)
    short_test = [r for r in test if words(r["text"]) <= SHORT_WORDS]
    test = test[:5000]

    def polarity(row: dict[str, Any]) -> str:
        return ("neg", "pos")[row["label"]]

    def reviews(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
        return [{"text": r["text"], "label": polarity(r)} for r in rows]

    def firsts(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
        found = [{"text": first(r["text"]), "label": polarity(r)} for r in rows]
        return [row for row in found if len(row["text"].split()) >= 3]

    def lasts(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
        return [{"text": last(r["text"]), "label": polarity(r)} for r in rows]

    write(args.out / "imdb1k.train.jsonl", reviews(train[:1000]))
    write(args.out / "imdb5k.train.jsonl", reviews(train[:5000]))
    write(args.out / "imdb.test5k.jsonl", reviews(test))
    write(args.out / "first.train.jsonl", firsts(train)[:7000])
    write(args.out / "first.test.jsonl", firsts(test))
    write(args.out / "last.train.jsonl", lasts(train[:7000]))
    write(args.out / "last.test.jsonl", lasts(test))
    for name, rows in (("multi.train", train[:7000]), ("multi.test", test)):
        labelled = [{"text": r["text"], "label": RATING_CLASSES[r["rating"]]} for r in rows]
        write(args.out / f"{name}.jsonl", labelled)
    noisy = reviews(train[:5000])
    for row in noisy:
        if rng.random() < 0.2:
            row["label"] = "pos" if row["label"] == "neg" else "neg"
    write(args.out / "noisy5k.train.jsonl", noisy)
    short = [r for r in train if words(r["text"]) <= SHORT_WORDS]
    write(args.out / "short.train.jsonl", reviews(short))
    write(args.out / "short.test.jsonl", reviews(short_test))


if __name__ == "__main__":
    main()
