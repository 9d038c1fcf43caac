"""The classification task's small pieces: label order, settings, the held-out split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qkv.data.cache import CACHE_FILE
from qkv.errors import ConfigError, DataError
from qkv.tasks.classification import (
    ClassificationData,
    found_fields,
    label_notes,
    prepare,
    sorted_labels,
)


def test_labels_sort_as_numbers_only_when_they_are_ascii_integers() -> None:
    assert sorted_labels(["10", "2", "-1"]) == ["-1", "2", "10"]
    assert sorted_labels(["²", "1"]) == ["1", "²"]  # a digit to str.isdigit, not to int()
    assert sorted_labels(["pos", "neg"]) == ["neg", "pos"]


def test_integer_labels_of_one_value_keep_one_order() -> None:
    """ "1" and "01" are one integer; their order follows their text, not the set's hashing,
    which changes from process to process."""
    for values in (["1", "01", "2"], ["01", "2", "1"], ["2", "1", "01"]):
        assert sorted_labels(values) == ["01", "1", "2"]


def test_the_labels_are_named_with_their_examples_and_a_likely_mistake_is_warned_of() -> None:
    labels = ["neg"] * 3 + ["pos"] * 2 + ["Label", "pso"]
    notes = label_notes(["Label", "neg", "pos", "pso"], labels, "label")
    assert notes[0] == "4 labels, with their training examples: Label 1, neg 3, pos 2, pso 1"
    assert notes[1] == "warning: a label is the label column's name, 'label': a header row?"
    assert notes[2] == "warning: one training example only for pso: a typo?"
    assert label_notes(["neg", "pos"], ["neg", "pos", "pos", "neg"], "label") == [
        "2 labels, with their training examples: neg 2, pos 2"
    ]


@pytest.mark.parametrize("fraction", [0.0, -0.2, 1.0, 1.5])
def test_the_validation_share_is_between_0_and_1(fraction: float) -> None:
    with pytest.raises(ConfigError, match="valid_fraction"):
        ClassificationData(train_file="t.jsonl", valid_fraction=fraction).check()
    ClassificationData(train_file="t.jsonl", valid_file="v.jsonl", valid_fraction=fraction).check()


def test_a_label_lost_to_the_held_out_share_is_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "two.jsonl"
    rows = [{"text": "good", "label": 1}, {"text": "bad", "label": 0}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    data = ClassificationData(train_file=str(path), valid_fraction=0.5, vocab_size=50)
    with pytest.raises(DataError, match="once the validation share is held out"):
        prepare(data, tmp_path / "run", None, seed=0)


def test_training_tokens_are_read_from_the_cache(tmp_path: Path) -> None:
    path = tmp_path / "reviews.jsonl"
    rows = [{"text": f"review {i} " + "good " * (i % 5), "label": i % 2} for i in range(30)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    data = ClassificationData(train_file=str(path), vocab_size=60, min_frequency=1, max_len=4)
    _, corpora, data = prepare(data, tmp_path / "run", None, seed=0)
    assert corpora["train.ids"].on_disk and len(corpora["train.ids"]) == 27
    assert corpora["train.ids"].lengths.max() <= 4  # truncated to max_len
    assert len(corpora["valid.ids"]) == len(corpora["valid.labels"]) == 3
    labels = [*corpora["train.labels"].flat().tolist(), *corpora["valid.labels"].flat().tolist()]
    assert sorted(labels) == [0] * 15 + [1] * 15


def test_a_resumed_run_holds_out_the_share_it_began_with_whatever_its_seed(
    tmp_path: Path,
) -> None:
    """A resume whose cache is gone splits again: by the run's first seed, not its new one,
    lest it train on what it validated on."""
    path = tmp_path / "reviews.jsonl"
    rows = [{"text": f"review {i} " + "good " * (i % 5), "label": i % 2} for i in range(30)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    data = ClassificationData(train_file=str(path), vocab_size=60, min_frequency=1)
    tokenizer, first, data = prepare(data, tmp_path / "run", None, seed=0)
    assert data.split_seed == 0
    (tmp_path / "run" / CACHE_FILE).unlink()
    with pytest.warns(UserWarning, match="is gone"):
        _, again, _ = prepare(data, tmp_path / "run", tokenizer, seed=7)  # resumed, seed=7
    assert [list(row) for row in again["valid.ids"]] == [list(row) for row in first["valid.ids"]]


def test_validation_texts_that_are_training_texts_are_warned_of(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "reviews.jsonl"
    rows = [{"text": f"review {i}", "label": i % 2} for i in range(20)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    data = ClassificationData(train_file=str(path), vocab_size=60, min_frequency=1)
    prepare(data, tmp_path / "held-out", None, seed=0)
    assert "warning" not in capsys.readouterr().out
    data = ClassificationData(train_file=str(path), valid_file=str(path), vocab_size=60)
    prepare(data, tmp_path / "same", None, seed=0)
    assert (
        "warning: 20 of the 20 validation texts are training texts too" in capsys.readouterr().out
    )


@pytest.mark.parametrize(
    ("name", "content", "fields", "note"),
    [
        ("sst.tsv", "sentence\tlabel\ngood\t1\n", ("sentence", "label"), "texts from 'sentence'"),
        (
            "reviews.jsonl",
            '\n{"Review": "good", "sentiment": "pos"}\n',
            ("Review", "sentiment"),
            "labels from 'sentiment' and texts from 'Review'",
        ),
        ("ids.csv", "id,body,label\n1,good,1\n", ("body", "label"), "texts from 'body'"),
        ("two.csv", "title,body,label\nA,good,1\n", ("text", "label"), ""),  # two candidates
        ("one.csv", "idx,comment,label\n1,good,1\n", ("comment", "label"), "texts from 'comment'"),
        ("ids.tsv", "id\tlabel\n1\tgood\n", ("text", "label"), ""),  # an id is no text
        ("plain.csv", "text,label\ngood,1\n", ("text", "label"), ""),
        ("broken.jsonl", "[1, 2]\n", ("text", "label"), ""),  # the full read says why
    ],
)
def test_a_new_runs_fields_are_found_among_common_names(
    tmp_path: Path, name: str, content: str, fields: tuple[str, str], note: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    data = ClassificationData(train_file=str(path))
    found = found_fields(data, given=())
    assert (data.text_field, data.label_field) == fields
    assert found == (f"reading {note} (text_field= and label_field= name others)" if note else "")


def test_fields_given_are_kept_as_given(tmp_path: Path) -> None:
    path = tmp_path / "sst.tsv"
    path.write_text("sentence\tlabel\ngood\t1\n")
    data = ClassificationData(train_file=str(path))
    assert found_fields(data, given=("text_field",)) == ""
    assert data.text_field == "text"
