"""Writes the bad-input corpus under tests/corpus/: run once, commit what it writes.

    python tests/corpus/make_corpus.py

translation/<case>/  a data directory for `qkv train translation --data`, broken one way each
text/                one-sentence-per-line inputs for `qkv translate` and `qkv evaluate`
labelled/            JSONL/CSV/TSV files for the classification commands

The generated files are byte-for-byte reproducible; several are not valid UTF-8 or not valid gzip,
which is why they are written by a script rather than by hand.
"""

from __future__ import annotations

import gzip
import json
import random
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent
WORDS = {
    "de": ["ein", "zwei", "drei", "mann", "frau", "hund", "katze", "haus", "rot", "blau", "groß"],
    "en": ["one", "two", "three", "man", "woman", "dog", "cat", "house", "red", "blue", "big"],
}


def sentences(n: int, seed: int) -> dict[str, list[str]]:
    """`n` aligned word-by-word "translations" from a tiny lexicon."""
    rng = random.Random(seed)
    out: dict[str, list[str]] = {"de": [], "en": []}
    for _ in range(n):
        idx = [rng.randrange(len(WORDS["de"])) for _ in range(rng.randint(2, 6))]
        for lang in out:
            out[lang].append(" ".join(WORDS[lang][i] for i in idx))
    return out


def lines(items: list[str]) -> bytes:
    return "".join(item + "\n" for item in items).encode("utf-8")


def gzip_bytes(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def translation_dir(name: str, **files: bytes | None) -> None:
    """A data directory with small good train/val files, some of them replaced by `files`."""
    train, val = sentences(6, seed=1), sentences(3, seed=2)
    default = {
        "train.de": lines(train["de"]),
        "train.en": lines(train["en"]),
        "val.de": lines(val["de"]),
        "val.en": lines(val["en"]),
    }
    for key, data in files.items():
        filename = key.replace("_", ".")
        default.pop(filename.removesuffix(".gz"), None)
        default[filename] = data
    for filename, data in default.items():
        if data is not None:
            write(ROOT / "translation" / name / filename, data)


def make_translation() -> None:
    train, val = sentences(40, seed=1), sentences(8, seed=2)
    for lang in ("de", "en"):
        write(ROOT / "translation" / "good" / f"train.{lang}", lines(train[lang]))
        write(ROOT / "translation" / "good" / f"val.{lang}", lines(val[lang]))
    six = sentences(6, seed=1)
    translation_dir("mismatch", train_en=lines(six["en"][:5]))
    translation_dir("val_mismatch", val_de=lines(sentences(4, seed=2)["de"]))
    translation_dir("empty_line", train_en=lines([*six["en"][:2], "", *six["en"][3:]]))
    translation_dir("blank_line", val_de=lines(["ein hund", "  \t ", "zwei katze"]))
    translation_dir(
        "bad_utf8", train_de=lines(six["de"][:1]) + b"ein gro\xdf hund\n" + lines(six["de"][2:])
    )
    truncated = gzip_bytes(lines(six["de"]))
    translation_dir("truncated_gz", train_de_gz=truncated[: len(truncated) // 2])
    translation_dir("not_gzip", train_de_gz=lines(six["de"]))
    translation_dir("empty_file", train_en=b"")
    translation_dir("no_val", val_de=None, val_en=None)
    translation_dir("cr_only", train_de=b"\r".join(w.encode() for w in six["de"]) + b"\r")
    translation_dir("dir_as_file", train_de=None)  # train.de is a directory, made below
    write(ROOT / "translation" / "dir_as_file" / "train.de" / "README", b"not a file\n")
    long_val = sentences(3, seed=2)
    long_val["de"][1] = " ".join(["mann"] * 300)
    long_val["en"][1] = " ".join(["man"] * 300)
    write(ROOT / "translation" / "long_val" / "train.de", lines(train["de"]))
    write(ROOT / "translation" / "long_val" / "train.en", lines(train["en"]))
    write(ROOT / "translation" / "long_val" / "val.de", lines(long_val["de"]))
    write(ROOT / "translation" / "long_val" / "val.en", lines(long_val["en"]))


def make_text() -> None:
    val = sentences(8, seed=2)
    write(ROOT / "text" / "src.de", lines(val["de"]))
    write(ROOT / "text" / "ref.en", lines(val["en"]))
    write(ROOT / "text" / "ref_short.en", lines(val["en"][:7]))
    write(ROOT / "text" / "ref_empty_line.en", lines([*val["en"][:4], "", *val["en"][5:]]))
    write(ROOT / "text" / "bad_utf8.de", lines(val["de"][:2]) + b"\xff\xfe ein hund\n")
    write(ROOT / "text" / "empty.de", b"")
    packed = gzip_bytes(lines(val["de"]))
    write(ROOT / "text" / "truncated.de.gz", packed[:-12])
    write(ROOT / "text" / "cr_only.de", "\r".join(val["de"]).encode() + b"\r")
    crlf = "".join(line + "\r\r\n" for line in val["de"]).encode()  # CRLF converted twice
    write(ROOT / "text" / "crcrlf.de", crlf)
    invisible = [val["de"][0], "\u200b\u200b", "\u200d \ufeff", val["de"][3]]
    write(ROOT / "text" / "invisible.de", lines(invisible))


def jsonl(records: list[object]) -> bytes:
    return lines([json.dumps(r, ensure_ascii=False) for r in records])


def make_labelled() -> None:
    good = [
        {"text": "a wonderful film, warm and funny", "label": "pos"},
        {"text": "dull, slow and far too long", "label": "neg"},
        {"text": "I loved every minute of it", "label": "pos"},
        {"text": "the worst script of the year", "label": "neg"},
    ] * 5
    out = ROOT / "labelled"
    write(out / "good.jsonl", jsonl(good))
    write(out / "good.csv", b"text,label\n" + lines([f'"{r["text"]}",{r["label"]}' for r in good]))
    write(out / "unknown_label.jsonl", jsonl([*good[:3], {"text": "meh", "label": "neutral"}]))
    write(out / "malformed.jsonl", jsonl(good[:2]) + b'{"text": "cut off", "label": \n')
    write(out / "not_object.jsonl", jsonl(good[:1]) + b'["text", "label"]\n')
    write(out / "missing_field.jsonl", jsonl([*good[:2], {"text": "no label here"}]))
    write(out / "empty_label.jsonl", jsonl([*good[:3], {"text": "blank", "label": " "}]))
    write(out / "empty_text.jsonl", jsonl([*good[:1], {"text": "", "label": "pos"}]))
    write(out / "bool_label.jsonl", jsonl([*good[:2], {"text": "yes", "label": True}]))
    write(out / "bad_utf8.jsonl", jsonl(good[:2]) + b'{"text": "caf\xe9", "label": "pos"}\n')
    packed = gzip_bytes(jsonl(good))
    write(out / "truncated.jsonl.gz", packed[: len(packed) // 2])
    write(out / "missing_column.csv", b"title,body,label\nA,fine film,pos\n")
    write(out / "wrong_fields.csv", b"text,label\nfine film,pos\ntoo,many,fields\n")
    write(out / "unclosed_quote.csv", b'text,label\nfine film,pos\n"never closed,neg\n')
    write(out / "missing_column.tsv", b"text\tstars\nfine film\tpos\n")
    write(out / "unknown_format.xml", b"<review label='pos'>fine film</review>\n")
    write(out / "empty.jsonl", b"\n\n")
    surrogate = {"text": "bad \ud800 text", "label": "pos"}
    write(out / "surrogate_text.jsonl", jsonl(good[:2]) + json.dumps(surrogate).encode() + b"\n")
    surrogate = {"text": "fine", "label": "\udc80pos"}
    write(out / "surrogate_label.jsonl", jsonl(good[:3]) + json.dumps(surrogate).encode() + b"\n")
    write(
        out / "invisible_text.jsonl", jsonl([*good[:2], {"text": "\u200b\u200b", "label": "pos"}])
    )
    # the record on line 5 is nothing once its HTML line breaks are cleaned away
    write(out / "breaks_only.csv", b'text,label\n"great\nmovie\nreally",pos\n"<br /><br/>",neg\n')


def main() -> None:
    for name in ("translation", "text", "labelled"):
        shutil.rmtree(ROOT / name, ignore_errors=True)
    make_translation()
    make_text()
    make_labelled()


if __name__ == "__main__":
    main()
