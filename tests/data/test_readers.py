"""Readers return clean lines and records, and every bad file becomes a DataError with a place."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from qkv.data.readers import (
    find_split,
    is_blank,
    read_labelled,
    read_lines,
    read_parallel,
    read_texts,
)
from qkv.errors import DataError


def write(path: Path, data: bytes | str) -> Path:
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def assert_data_error(error: pytest.ExceptionInfo[DataError], path: Path, line: int | None) -> None:
    message = str(error.value)
    assert path.name in message
    assert error.value.line == line
    if line is not None:
        assert f"{path.name}:{line}:" in message


def test_read_lines_strips_newlines_and_keeps_text(tmp_path: Path) -> None:
    path = write(tmp_path / "a.txt", "Zwei Männer.\r\nEin Hund\nlast line without newline")
    assert read_lines(path) == ["Zwei Männer.", "Ein Hund", "last line without newline"]


def test_read_lines_drops_byte_order_mark(tmp_path: Path) -> None:
    path = write(tmp_path / "bom.txt", "\ufeffHallo\nWelt\n")
    assert read_lines(path) == ["Hallo", "Welt"]


def test_read_lines_splits_on_newline_only(tmp_path: Path) -> None:
    path = write(tmp_path / "u2028.txt", "one\u2028still one\ntwo\n")
    assert read_lines(path) == ["one\u2028still one", "two"]


def test_carriage_returns_that_end_a_line_are_all_dropped(tmp_path: Path) -> None:
    path = write(tmp_path / "twice.txt", "Ein Mann.\r\r\nZwei\r\n\r\r\n")  # CRLF converted twice
    assert read_lines(path, allow_empty=True) == ["Ein Mann.", "Zwei", ""]


def test_lines_ended_by_carriage_returns_alone_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "mac.txt", "Ein Mann.\rZwei Hunde.\r")
    with pytest.raises(DataError, match="carriage return alone") as error:
        read_lines(path)
    assert_data_error(error, path, None)
    assert read_lines(write(tmp_path / "one.txt", "one line\r")) == ["one line"]
    assert read_lines(write(tmp_path / "inside.txt", "Ein\rHund\n")) == ["Ein\rHund"]


@pytest.mark.parametrize(
    ("text", "blank"),
    [
        ("", True),
        (" \t", True),
        ("\u200b\u200d\ufeff \u200e", True),
        ("a\u200b", False),
        ("\u0301", False),
    ],
)
def test_blank_means_nothing_visible(text: str, blank: bool) -> None:
    assert is_blank(text) is blank


def test_invisible_lines_are_empty_lines(tmp_path: Path) -> None:
    path = write(tmp_path / "zw.txt", "one\n\u200b\u200b\nthree\n")
    with pytest.raises(DataError, match="empty line") as error:
        read_lines(path)
    assert_data_error(error, path, 2)


def test_bad_utf8_column_counts_characters(tmp_path: Path) -> None:
    path = write(tmp_path / "col.de", "Ein Mann.\nschön größer ".encode() + b"\xe4 x\n")
    with pytest.raises(DataError, match=r"byte 0xe4 at column 14\)") as error:
        read_lines(path)
    assert_data_error(error, path, 2)


def test_bad_utf8_reports_line_three(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.de", b"eins\nzwei\ndr\xffei\nvier\n")
    with pytest.raises(DataError, match="invalid UTF-8") as error:
        read_lines(path)
    assert_data_error(error, path, 3)


def test_empty_line_reports_line_two(tmp_path: Path) -> None:
    path = write(tmp_path / "gap.en", "one\n   \nthree\n")
    with pytest.raises(DataError, match="empty line") as error:
        read_lines(path)
    assert_data_error(error, path, 2)
    assert read_lines(path, allow_empty=True) == ["one", "   ", "three"]


@pytest.mark.parametrize("content", [b"", b"\xef\xbb\xbf"])
def test_empty_file(tmp_path: Path, content: bytes) -> None:
    path = write(tmp_path / "empty.txt", content)
    with pytest.raises(DataError, match="file is empty") as error:
        read_lines(path)
    assert_data_error(error, path, None)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        read_lines(tmp_path / "missing.txt")
    with pytest.raises(DataError, match="directory"):
        read_lines(tmp_path)


def test_gzip_is_read_by_suffix_and_by_magic_bytes(tmp_path: Path) -> None:
    packed = gzip.compress(b"Hallo\nWelt\n")
    assert read_lines(write(tmp_path / "a.de.gz", packed)) == ["Hallo", "Welt"]
    assert read_lines(write(tmp_path / "a.de", packed)) == ["Hallo", "Welt"]


def test_gzip_bad_utf8_reports_line(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.de.gz", gzip.compress(b"ok\nok\n\xc3\x28\n"))
    with pytest.raises(DataError, match="invalid UTF-8") as error:
        read_lines(path)
    assert_data_error(error, path, 3)


def test_truncated_gzip(tmp_path: Path) -> None:
    packed = gzip.compress(("ein Satz\n" * 200).encode())
    path = write(tmp_path / "cut.de.gz", packed[: len(packed) // 2])
    with pytest.raises(DataError, match="corrupt or truncated gzip") as error:
        read_lines(path)
    assert_data_error(error, path, None)


def test_gz_suffix_without_gzip_content(tmp_path: Path) -> None:
    path = write(tmp_path / "plain.en.gz", "not compressed\n")
    with pytest.raises(DataError, match="not gzip"):
        read_lines(path)


def test_find_split_takes_plain_or_gzip_and_refuses_both(tmp_path: Path) -> None:
    write(tmp_path / "train.de.gz", gzip.compress(b"x\n"))
    assert find_split(tmp_path, "train", "de") == tmp_path / "train.de.gz"
    write(tmp_path / "train.en", "x\n")
    assert find_split(tmp_path, "train", "en") == tmp_path / "train.en"
    write(tmp_path / "train.de", "x\n")
    with pytest.raises(DataError, match=r"both train\.de and train\.de\.gz are here; keep one"):
        find_split(tmp_path, "train", "de")


def test_find_split_takes_valid_and_dev_for_val(tmp_path: Path) -> None:
    write(tmp_path / "dev.de", "x\n")
    assert find_split(tmp_path, "val", "de") == tmp_path / "dev.de"
    write(tmp_path / "valid.de.gz", gzip.compress(b"x\n"))
    assert find_split(tmp_path, "val", "de") == tmp_path / "valid.de.gz"
    write(tmp_path / "val.de", "x\n")
    assert find_split(tmp_path, "val", "de") == tmp_path / "val.de"
    with pytest.raises(
        DataError, match=r"\(looked for val\.en, val\.en\.gz, valid\.en, .*dev\.en\.gz\)"
    ):
        find_split(tmp_path, "val", "en")


def test_find_split_lists_what_it_looked_for(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"valid\.en, valid\.en\.gz"):
        find_split(tmp_path, "valid", "en")
    with pytest.raises(DataError, match="nowhere: no such directory"):
        find_split(tmp_path / "nowhere", "valid", "en")
    (tmp_path / "file").write_text("text\n")
    with pytest.raises(DataError, match="file: not a directory"):
        find_split(tmp_path / "file", "valid", "en")


def test_read_parallel(tmp_path: Path) -> None:
    src = write(tmp_path / "train.de", "Hallo\nWelt\n")
    tgt = write(tmp_path / "train.en", "Hello\nWorld\n")
    assert read_parallel(src, tgt) == (["Hallo", "Welt"], ["Hello", "World"])


def test_read_parallel_unequal_counts_names_both(tmp_path: Path) -> None:
    src = write(tmp_path / "train.de", "a\nb\nc\n")
    tgt = write(tmp_path / "train.en", "a\nb\n")
    with pytest.raises(DataError) as error:
        read_parallel(src, tgt)
    message = str(error.value)
    assert "train.de" in message and "train.en" in message
    assert "3" in message and "2" in message


def test_read_labelled_jsonl(tmp_path: Path) -> None:
    lines = '{"text": "great film", "label": 1}\n\n{"text": "dull", "label": "neg"}\n'
    path = write(tmp_path / "train.jsonl", lines)
    assert read_labelled(path) == (["great film", "dull"], ["1", "neg"])


def test_read_labelled_custom_fields_gzip(tmp_path: Path) -> None:
    path = write(tmp_path / "train.jsonl.gz", gzip.compress(b'{"sentence": "ok", "y": 0}\n'))
    assert read_labelled(path, text_field="sentence", label_field="y") == (["ok"], ["0"])


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ('{"text": "a", "label": ', "malformed JSON"),
        ('["a", 1]', "expected a JSON object"),
        ('{"text": "a"}', "missing field 'label'"),
        ('{"text": "  ", "label": 1}', "empty 'text'"),
        ('{"text": 5, "label": 1}', "must be a string, got int"),
        ('{"text": null, "label": 1}', "must be a string, got null"),
        ('{"text": "a", "label": null}', "must be a string or integer, got null"),
        ('{"text": "a", "label": [1]}', "must be a string or integer, got array"),
    ],
)
def test_read_labelled_jsonl_errors_name_line(tmp_path: Path, line: str, match: str) -> None:
    path = write(tmp_path / "bad.jsonl", '{"text": "fine", "label": 0}\n' + line + "\n")
    with pytest.raises(DataError, match=match) as error:
        read_labelled(path)
    assert_data_error(error, path, 2)


def test_read_labelled_csv_with_quotes(tmp_path: Path) -> None:
    path = write(tmp_path / "train.csv", 'label,text\n1,"good, really"\n0,"multi\nline"\n')
    assert read_labelled(path) == (["good, really", "multi\nline"], ["1", "0"])


def test_read_labelled_csv_missing_column_names_available(tmp_path: Path) -> None:
    path = write(tmp_path / "train.csv", "sentence,label\nhello,1\n")
    with pytest.raises(DataError, match=r"missing column 'text' \(columns: 'sentence', 'label'\)$"):
        read_labelled(path)
    # Read for training: the setting that names another column is said.
    with pytest.raises(DataError, match=r"'label'\); name another with label_field=NAME$"):
        read_labelled(
            path,
            text_field="sentence",
            label_field="stars",
            hints=["text_field=NAME", "label_field=NAME"],
        )


def test_read_labelled_csv_wrong_field_count(tmp_path: Path) -> None:
    path = write(tmp_path / "train.csv", "text,label\nhello,1\nextra,1,2\n")
    with pytest.raises(DataError, match="expected 2 fields, got 3") as error:
        read_labelled(path)
    assert_data_error(error, path, 3)


def test_read_labelled_tsv_keeps_quotes(tmp_path: Path) -> None:
    path = write(tmp_path / "train.tsv", 'sentence\tlabel\n"quoted" start\t1\nplain\t0\n')
    texts, labels = read_labelled(path, text_field="sentence")
    assert texts == ['"quoted" start', "plain"]
    assert labels == ["1", "0"]


def test_read_labelled_tsv_wrong_field_count(tmp_path: Path) -> None:
    path = write(tmp_path / "dev.tsv", "text\tlabel\na\t1\nb\n")
    with pytest.raises(DataError, match=r"expected 2 fields, got 1$") as error:
        read_labelled(path)
    assert_data_error(error, path, 3)
    path = write(tmp_path / "quoted.tsv", 'text\tlabel\na\t1\n"multi\nline"\t0\n')
    with pytest.raises(
        DataError, match=r"got 1 \(TSV fields are not quoted: a quoted tab"
    ) as error:
        read_labelled(path)
    assert_data_error(error, path, 3)


def test_a_header_after_blank_lines_is_named_at_its_line(tmp_path: Path) -> None:
    path = write(tmp_path / "lead.csv", "\n\nText,label\ngood,pos\n")
    with pytest.raises(DataError, match="missing column 'text'") as error:
        read_labelled(path)
    assert_data_error(error, path, 3)


def test_the_format_suffix_may_be_upper_case(tmp_path: Path) -> None:
    path = write(tmp_path / "UP.CSV.GZ", gzip.compress(b'text,label\n"good, yes",pos\n'))
    assert read_labelled(path) == (["good, yes"], ["pos"])
    assert read_texts(path) == ["good, yes"]


def test_read_labelled_unknown_format_and_no_records(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"unknown format '\.txt'"):
        read_labelled(write(tmp_path / "train.txt", "a\n"))
    with pytest.raises(DataError, match="no records"):
        read_labelled(write(tmp_path / "header.csv", "text,label\n"))


def test_read_texts(tmp_path: Path) -> None:
    assert read_texts(write(tmp_path / "in.txt", "eins\nzwei\n")) == ["eins", "zwei"]
    jsonl = write(tmp_path / "in.jsonl", '{"text": "eins", "id": 3}\n{"text": "zwei"}\n')
    assert read_texts(jsonl) == ["eins", "zwei"]
    with pytest.raises(DataError, match="missing field 'text'") as error:
        read_texts(write(tmp_path / "bad.jsonl", '{"text": "a"}\n{"body": "b"}\n'))
    assert error.value.line == 2


def test_labels_outside_the_known_ones_name_the_line_a_record_starts_on(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text('text,label\n"three\nline\nreview",1\n\nfine,0\nmeh,7\n')
    with pytest.raises(DataError, match=r"d\.csv:7: unknown label '7' \(known labels: 0, 1\)"):
        read_labelled(path, known_labels=["0", "1"])
    path.write_text('text,label\n"three\nline\nreview",7\n')
    with pytest.raises(DataError, match=r"d\.csv:2: unknown label"):
        read_labelled(path, known_labels=["0", "1"])


def test_csv_and_tsv_fields_may_be_long(tmp_path: Path) -> None:
    text = "word " * 60_000  # 300,000 characters, over Python's csv default of 131,072
    for name, sep in (("long.csv", ","), ("long.tsv", "\t")):
        path = tmp_path / name
        path.write_text(f"text{sep}label\n{text}{sep}1\n")
        assert read_labelled(path) == ([text], ["1"])


def test_a_directory_or_missing_file_says_so_before_its_format(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="is a directory"):
        read_labelled(tmp_path)
    with pytest.raises(DataError, match="no such file"):
        read_labelled(tmp_path / "train.txt")


def test_read_texts_takes_the_text_field(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"review": "a"}\n\n{"review": "b"}\n')
    assert read_texts(path, text_field="review") == ["a", "b"]
    with pytest.raises(DataError, match=r"t\.jsonl:1: missing field 'text'"):
        read_texts(path)


def test_table_problems_are_described_briefly(tmp_path: Path) -> None:
    path = tmp_path / "q.csv"
    path.write_text('text,label\n"fine",1\n"never closed,0\nmore,1\n')
    unclosed = r"q\.csv:3: expected 2 fields, got 1 \(an unclosed quote\?\)"
    with pytest.raises(DataError, match=unclosed):
        read_labelled(path)
    path = tmp_path / "j.csv"
    path.write_text('{"text": "' + "long review " * 50 + '", "label": 1}\n')
    with pytest.raises(DataError, match="missing column 'text'") as error:
        read_labelled(path)
    assert len(str(error.value)) < 200


@pytest.mark.parametrize(
    ("record", "field"),
    [
        ('{"text": "bad \\ud800 text", "label": "a"}', "text"),
        ('{"text": "ok", "label": "\\udc80"}', "label"),
    ],
)
def test_a_lone_surrogate_is_not_text(tmp_path: Path, record: str, field: str) -> None:
    path = write(tmp_path / "s.jsonl", '{"text": "fine", "label": "a"}\n' + record + "\n")
    with pytest.raises(
        DataError,
        match=f"'{field}' holds U\\+D[8C]",
    ) as error:
        read_labelled(path)
    assert_data_error(error, path, 2)


def test_a_text_blank_once_cleaned_is_refused_at_its_line(tmp_path: Path) -> None:
    path = write(tmp_path / "c.csv", 'text,label\n"great\nfilm",a\n"<br/>",b\n')
    assert read_labelled(path)[0] == ["great\nfilm", "<br/>"]
    clean = lambda text: text.replace("<br/>", " ")  # noqa: E731
    with pytest.raises(DataError, match="'text' is empty once cleaned") as error:
        read_labelled(path, clean=clean)
    assert_data_error(error, path, 4)
    with pytest.raises(DataError, match="empty once cleaned") as error:
        read_texts(path, clean=clean)
    assert_data_error(error, path, 4)


def test_find_split_says_when_a_split_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "train.de").mkdir()
    with pytest.raises(DataError, match="is a directory") as error:
        find_split(tmp_path, "train", "de")
    assert_data_error(error, tmp_path / "train.de", None)


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_a_column_named_twice_is_ambiguous(tmp_path: Path, suffix: str) -> None:
    sep = "," if suffix == ".csv" else "\t"
    path = write(tmp_path / f"train{suffix}", sep.join(["label", "text", "label"]) + "\n")
    path.write_text(path.read_text() + sep.join(["1", "good", "9"]) + "\n")
    with pytest.raises(DataError, match=r"column 'label' appears more than once \(columns 1 and 3"):
        read_labelled(path)
    assert read_texts(path) == ["good"]  # an unused column may repeat


@pytest.mark.parametrize("label", ["a\nb", "a\tb", "neg\x00"])
def test_a_label_is_one_line_of_text(tmp_path: Path, label: str) -> None:
    path = write(tmp_path / "train.jsonl", '{"text": "fine", "label": "pos"}\n')
    path.write_text(path.read_text() + json.dumps({"text": "bad", "label": label}) + "\n")
    with pytest.raises(DataError, match="holds the control character") as error:
        read_labelled(path)
    assert_data_error(error, path, 2)


def test_labels_that_look_the_same_are_the_same(tmp_path: Path) -> None:
    composed, decomposed = "n\u00e9gatif", "ne\u0301gatif"
    rows = [{"text": "x", "label": composed}, {"text": "y", "label": decomposed}]
    path = write(tmp_path / "train.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    assert read_labelled(path)[1] == [composed, composed]
