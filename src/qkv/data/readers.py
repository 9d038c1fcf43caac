"""Corpus readers: plain or gzipped UTF-8 text, JSON Lines, CSV and TSV. Every problem with
a file is a `DataError` naming the file and, where it applies, the 1-based line.
"""

from __future__ import annotations

import csv
import io
import json
import unicodedata
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from qkv.data.lines import A_DIRECTORY, NO_FILE, count_lines, is_blank, line_chunks, read_text
from qkv.errors import DataError

LABELLED_FORMATS = (".jsonl", ".json", ".csv", ".tsv")
FIELD_SIZE_LIMIT = 2**31 - 1  # the longest CSV or TSV field read (the csv default is 131,072)


def read_lines(path: str | Path, *, allow_empty: bool = False) -> list[str]:
    """The lines of a UTF-8 text file, optionally gzipped, as `lines.line_chunks` splits and
    checks them; a blank line (see `is_blank`) is a DataError unless `allow_empty`."""
    return [line for chunk in line_chunks(path, allow_empty=allow_empty) for line in chunk]


SPLIT_NAMES = {"val": ("val", "valid", "dev")}
"""Other names a split's files go by: validation files are `val`, `valid` or `dev`."""


def find_split(data_dir: str | Path, split: str, lang: str) -> Path:
    """The file of one side of a split ("train", "de"): `{name}.{lang}` or `{name}.{lang}.gz`
    in `data_dir`, for the first name of the split (`SPLIT_NAMES`) that has one; both (one
    likely a stale copy of the other) are refused."""
    directory = Path(data_dir)
    if not directory.is_dir():
        raise DataError(directory, "not a directory" if directory.exists() else "no such directory")
    names = SPLIT_NAMES.get(split, (split,))
    candidates = [directory / f"{name}.{lang}{gz}" for name in names for gz in ("", ".gz")]
    for candidate in candidates:
        if candidate.is_dir():
            raise DataError(candidate, A_DIRECTORY)
        if candidate.exists():
            if candidate.suffix != ".gz" and (gzipped := Path(f"{candidate}.gz")).exists():
                problem = f"both {candidate.name} and {gzipped.name} are here; keep one"
                raise DataError(directory, problem)
            return candidate
    looked_for = ", ".join(candidate.name for candidate in candidates)
    raise DataError(directory, f"no {split} file for language '{lang}' (looked for {looked_for})")


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> tuple[list[str], list[str]]:
    """Reads a sentence-aligned pair of files into (source lines, target lines)."""
    sources = read_lines(src_path)
    targets = read_lines(tgt_path)
    check_aligned(src_path, len(sources), tgt_path, len(targets))
    return sources, targets


def count_parallel(src_path: str | Path, tgt_path: str | Path) -> int:
    """The number of lines of a sentence-aligned pair of files, counted without reading them
    into memory; a DataError unless both have as many."""
    count = count_lines(src_path)
    check_aligned(src_path, count, tgt_path, count_lines(tgt_path))
    return count


def check_aligned(src_path: str | Path, sources: int, tgt_path: str | Path, targets: int) -> None:
    """A DataError unless the two sides of a parallel corpus have as many lines."""
    if sources != targets:
        raise DataError(
            src_path,
            f"has {sources} lines but {tgt_path} has {targets}; "
            "parallel files must have one sentence per line, aligned",
        )


def read_labelled(
    path: str | Path,
    *,
    text_field: str = "text",
    label_field: str = "label",
    known_labels: Collection[str] | None = None,
    clean: Callable[[str], str] | None = None,
    hints: Sequence[str] | None = None,
) -> tuple[list[str], list[str]]:
    """Reads a text-classification file into (texts, labels); a text blank once `clean`ed is
    refused. The suffix (less ".gz") gives the format: ".jsonl"/".json" (one JSON object a line),
    ".csv" or ".tsv" (a header row, then records; TSV fields are not quoted). Labels are
    strings (a JSON 1 becomes "1") in NFC, so that labels that look the same are the same.
    A missing field's error says how to name another where `hints` gives it for each field
    (`text_field=NAME`, `--text-field NAME`).
    """
    texts: list[str] = []
    labels: list[str] = []
    for line, (text, label) in _read_records(path, (text_field, label_field), hints):
        texts.append(_check_text(path, text, text_field, line, clean))
        labels.append(_check_label(path, label, label_field, line))
        if known_labels is not None and labels[-1] not in known_labels:
            known = ", ".join(known_labels)
            label = short_text(labels[-1])
            raise DataError(path, f"unknown label {label!r} (known labels: {known})", line)
    return texts, labels


def holds_records(path: str | Path) -> bool:
    """Whether `read_texts` reads `path` as records (JSON Lines, CSV, TSV, by its name)."""
    return _format_suffix(Path(path)) in LABELLED_FORMATS


def read_texts(
    path: str | Path,
    *,
    text_field: str = "text",
    clean: Callable[[str], str] | None = None,
    hint: str | None = None,
) -> list[str]:
    """Reads texts to predict on: the `text_field` of each record of a JSON Lines, CSV or
    TSV file (see `read_labelled`, `hint` as its `hints`), or one text per line of any other
    file."""
    records: list[tuple[int, list[object]]]
    if not holds_records(path):
        records = [(number, [line]) for number, line in enumerate(read_lines(path), start=1)]
    else:
        records = _read_records(path, (text_field,), hint and [hint])
    return [_check_text(path, text, text_field, line, clean) for line, (text,) in records]


def record_fields(path: str | Path) -> list[str]:
    """The field names of a labelled file, from its header (CSV, TSV) or its first record
    (JSONL), as far as its first lines show them; [] where they do not (the full read then
    says why)."""
    suffix = _format_suffix(Path(path))
    try:
        lines = next(line_chunks(path, 64, allow_empty=True), [])
    except (DataError, OSError):
        return []
    first = next((line for line in lines if not is_blank(line)), "")
    if suffix in (".csv", ".tsv"):
        return [name.strip() for name in next(_table_reader([first], suffix == ".tsv"), [])]
    try:
        record = json.loads(first) if suffix in (".jsonl", ".json") else None
    except (ValueError, RecursionError):
        return []
    return [str(key) for key in record] if isinstance(record, dict) else []


def _format_suffix(path: Path) -> str:
    return Path(path.name.lower().removesuffix(".gz")).suffix


def _read_records(
    path: str | Path, fields: Sequence[str], hints: Sequence[str] | None = None
) -> list[tuple[int, list[object]]]:
    """The values of `fields` in each record, with the 1-based line on which it starts; a
    missing field's error says how to name another, where `hints` gives it."""
    suffix = _format_suffix(Path(path))
    if suffix in (".jsonl", ".json"):
        records = _read_json_lines(path, fields, hints)
    elif suffix in (".csv", ".tsv"):
        records = _read_table(path, fields, hints, tsv=suffix == ".tsv")
    else:  # a missing file or a directory is reported as such, not as a format
        if Path(path).is_dir():
            raise DataError(path, A_DIRECTORY)
        if not Path(path).exists():
            raise DataError(path, NO_FILE)
        formats = ", ".join(LABELLED_FORMATS)
        raise DataError(path, f"unknown format '{suffix}', expected one of {formats} (or .gz)")
    if not records:
        raise DataError(path, "no records")
    return records


def _read_json_lines(
    path: str | Path, fields: Sequence[str], hints: Sequence[str] | None
) -> list[tuple[int, list[object]]]:
    records: list[tuple[int, list[object]]] = []
    for number, line in enumerate(read_lines(path, allow_empty=True), start=1):
        if is_blank(line):
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as error:
            raise DataError(path, _json_problem(error, line), line=number) from None
        if not isinstance(record, dict):
            raise DataError(
                path, f"expected a JSON object, got {type(record).__name__}", line=number
            )
        for i, field in enumerate(fields):
            if field not in record:
                available = ", ".join(map(repr, record)) or "none"
                problem = f"missing field '{field}' (fields: {available})"
                raise DataError(path, problem + _another(hints, i), line=number)
        records.append((number, [record[field] for field in fields]))
    return records


def _read_table(
    path: str | Path, fields: Sequence[str], hints: Sequence[str] | None, *, tsv: bool
) -> list[tuple[int, list[object]]]:
    text = io.StringIO(read_text(path), newline="")
    csv.field_size_limit(max(csv.field_size_limit(), FIELD_SIZE_LIMIT))
    reader = _table_reader(text, tsv)
    records: list[tuple[int, list[object]]] = []
    columns: list[str] | None = None
    positions: list[int] = []
    start = 1  # the line on which the next record starts
    try:
        for row in reader:
            line, start = start, reader.line_num + 1
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if columns is None:
                columns = [name.strip() for name in row]
                positions = [
                    _column_position(path, columns, field, _another(hints, i), line)
                    for i, field in enumerate(fields)
                ]
                continue
            if len(row) != len(columns):
                hint = ""
                if tsv and any('"' in value for value in row):
                    hint = " (TSV fields are not quoted: a quoted tab or line break needs .csv)"
                elif any("\n" in value for value in row):
                    hint = " (an unclosed quote?)"
                problem = f"expected {len(columns)} fields, got {len(row)}{hint}"
                raise DataError(path, problem, line=line)
            records.append((line, [row[position] for position in positions]))
    except csv.Error as error:
        kind = "TSV" if tsv else "CSV"
        raise DataError(path, f"malformed {kind}: {_short(error)}", line=start) from None
    return records


def _table_reader(lines: Iterable[str], tsv: bool) -> Any:
    """A CSV reader of `lines`; for TSV, split on tabs with no quoting."""
    return csv.reader(lines, delimiter="\t", quoting=csv.QUOTE_NONE) if tsv else csv.reader(lines)


def _column_position(
    path: str | Path, columns: list[str], field: str, another: str, line: int
) -> int:
    """Where `field` is in the header on `line`."""
    if field not in columns:
        available = ", ".join(repr(short_text(name)) for name in columns[:8])
        available += ", ..." if len(columns) > 8 else ""
        problem = f"missing column '{field}' (columns: {available}){another}"
        raise DataError(path, problem, line=line)
    if columns.count(field) > 1:
        where = " and ".join(str(i) for i, name in enumerate(columns, start=1) if name == field)
        problem = f"column '{field}' appears more than once (columns {where})"
        raise DataError(path, problem, line=line)
    return columns.index(field)


def _another(hints: Sequence[str] | None, i: int) -> str:
    """The end of a missing field's error that says how to name another: "; name another
    with text_field=NAME"."""
    return f"; name another with {hints[i]}" if hints else ""


def _check_text(
    path: str | Path, value: object, field: str, line: int, clean: Callable[[str], str] | None
) -> str:
    if not isinstance(value, str):
        raise DataError(path, f"'{field}' must be a string, got {_kind(value)}", line=line)
    _check_unicode(path, value, field, line)
    if is_blank(value):
        raise DataError(path, f"empty '{field}'", line=line)
    if clean is not None and is_blank(clean(value)):
        raise DataError(path, f"'{field}' is empty once cleaned: {short_text(value)!r}", line=line)
    return value


def lone_surrogate(text: str) -> str | None:
    """ "U+D800" for the first lone surrogate in `text` (from a JSON escape such as \\ud800
    or an undecodable byte of a command-line argument), else None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return f"U+{ord(text[error.start]):04X}"
    return None


def texts_list(texts: Iterable[str], name: str) -> list[str]:
    """`texts` as a list (a generator is read once), for an API that takes many texts; a
    TypeError for one string, for a set or a mapping (no order to answer in), or for anything
    but strings in it."""
    if isinstance(texts, str):
        raise TypeError(f"{name} must be a list of strings, not one string")
    if not isinstance(texts, Iterable) or isinstance(texts, (AbstractSet, Mapping)):
        raise TypeError(f"{name} must be a list of strings, not {type(texts).__name__}")
    values = list(texts)
    if not all(isinstance(value, str) for value in values):
        kinds = sorted({type(value).__name__ for value in values if not isinstance(value, str)})
        raise TypeError(f"{name} must be strings, got {', '.join(kinds)}")
    return values


def _check_unicode(path: str | Path, value: str, field: str, line: int) -> None:
    """Refuses a lone surrogate, such as a JSON escape \\ud800."""
    if (code := lone_surrogate(value)) is not None:
        raise DataError(path, f"'{field}' holds {code}, half of a surrogate pair, not text", line)


def _check_label(path: str | Path, value: object, field: str, line: int) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DataError(
            path, f"'{field}' must be a string or integer, got {_kind(value)}", line=line
        )
    label = str(value).strip()
    _check_unicode(path, label, field, line)
    if is_blank(label):
        raise DataError(path, f"empty '{field}'", line=line)
    if control := next((c for c in label if unicodedata.category(c) == "Cc"), None):
        raise DataError(
            path,
            f"'{field}' {short_text(label)!r} holds the control character {control!r}; "
            "a label is one line of text",
            line=line,
        )
    # NFC: an "é" typed as one character or as "e" plus an accent is one label.
    return unicodedata.normalize("NFC", label)


def _json_problem(error: Exception, line: str) -> str:
    if isinstance(error, json.JSONDecodeError):
        problem = f"malformed JSON: {error.msg} at column {error.colno}"
    else:
        problem = f"malformed JSON: {_short(error)}"
    if line.lstrip().startswith("["):
        problem += " (expected one JSON object per line)"
    return problem


def _short(error: Exception) -> str:
    return short_text(str(error).splitlines()[0] if str(error) else type(error).__name__, 120)


def short_text(text: str, limit: int = 40) -> str:
    """`text` cut to `limit` characters, "..." included, for a message."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _kind(value: object) -> str:
    """A JSON value's type as JSON names it where Python's name differs (null, not NoneType)."""
    names = {type(None): "null", dict: "object", list: "array"}
    return names.get(type(value), type(value).__name__)
