"""Files a user names and files a run writes: outputs that cannot be written, runs resumed from
elsewhere or after their data moved, fields of the user's naming, stdin as a file, permissions."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from qkv.cli import main
from qkv.training.checkpoint import UMASK

TRANSLATION = Path(__file__).resolve().parents[1] / "corpus" / "translation" / "good"
QKV = Path(sys.executable).with_name("qkv")
TINY_TRANSLATION = [
    "--preset",
    "tiny",
    "vocab_size=100",
    "max_tokens=256",
    "max_steps=2",
    "warmup=100",
]

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--preset", "tiny", "vocab_size=60", "max_steps=2", "eval_every=2"]
WORDS = {"0": ["dull", "slow", "bad", "boring"], "1": ["warm", "funny", "good", "great"]}


def qkv(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def reviews(path: Path, count: int = 24) -> Path:
    """JSONL with the text under "review" and the label under "sentiment", 0 or 1."""
    rows = [
        {
            "review": f"a {WORDS[str(i % 2)][i % 4]} film, {WORDS[str(i % 2)][(i + 1) % 4]}",
            "sentiment": i % 2,
        }
        for i in range(count)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def review_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A classifier trained on texts under "review" and labels under "sentiment"."""
    root = tmp_path_factory.mktemp("reviews")
    fields = ["text_field=review", "label_field=sentiment"]
    data, run = reviews(root / "train.jsonl"), root / "run"
    assert (
        main(["train", "classification", "--train", str(data), "--out", str(run), *TINY, *fields])
        == 0
    )
    return run


def test_classify_reads_the_runs_text_field(
    review_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = qkv(
        capsys, "classify", review_run, "--input", reviews(tmp_path / "t.jsonl", 3)
    )
    assert code == 0, err
    assert [line.split("\t")[0] in ("0", "1") for line in out.splitlines()] == [True] * 3


def test_classify_writes_an_output_file(
    review_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = reviews(tmp_path / "t.jsonl", 3)
    code, printed, err = qkv(capsys, "classify", review_run, "--input", texts)
    assert code == 0, err
    out = tmp_path / "labels" / "out.txt"
    code, _, err = qkv(capsys, "classify", review_run, "--input", texts, "--output", out)
    assert code == 2 and "cannot write (no directory" in err and not out.parent.exists()
    out.parent.mkdir()
    code, nothing, err = qkv(capsys, "classify", review_run, "--input", texts, "--output", out)
    assert code == 0 and nothing == "", err
    assert out.read_text(encoding="utf-8") == printed


def test_the_confusion_matrix_lines_up_when_counts_are_wider_than_labels(
    review_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = qkv(
        capsys, "evaluate", review_run, "--data", reviews(tmp_path / "e.jsonl", 60)
    )
    assert code == 0, err
    table = out.splitlines()[2:]  # after the scores and the table's caption
    assert len(table) == 3 and len({len(row) for row in table}) == 1, out
    counts = [int(v) for row in table[1:] for v in row.split()[1:]]
    assert sum(counts) == 60 and max(counts) >= 10


def test_resume_finds_the_data_from_another_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "data").mkdir()
    reviews(tmp_path / "data" / "train.jsonl")
    monkeypatch.chdir(tmp_path / "data")
    fields = ["text_field=review", "label_field=sentiment"]
    code, _, err = qkv(
        capsys,
        "train",
        "classification",
        "--train",
        "train.jsonl",
        "--out",
        "../run",
        *TINY,
        *fields,
    )
    assert code == 0, err
    monkeypatch.chdir(tmp_path.parent)
    code, _, err = qkv(capsys, "train", "--resume", tmp_path / "run", "max_steps=4")
    assert code == 0, err
    assert json.loads((tmp_path / "run" / "config.json").read_text())["data"]["train_file"] == str(
        tmp_path / "data" / "train.jsonl"
    )


def test_an_output_that_cannot_be_made_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = reviews(tmp_path / "train.jsonl")
    fields = ["text_field=review", "label_field=sentiment"]
    code, _, err = qkv(
        capsys, "train", "classification", "--train", data, "--out", data / "run", *TINY, *fields
    )
    assert code == 2
    assert err == f"qkv: {data / 'run'}: {data} is a file, not a directory\n", err


@pytest.fixture(scope="module")
def translation_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("translation") / "run"
    args = ["train", "translation", "--data", str(TRANSLATION), "--out", str(run)]
    assert main([*args, *TINY_TRANSLATION, "eval_every=2"]) == 0
    return run


def one_step_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """tmp_path / "run", trained for one step on a copy of the corpus in tmp_path / "data"."""
    shutil.copytree(TRANSLATION, tmp_path / "data")
    run = tmp_path / "run"
    code, _, err = qkv(
        capsys, "train", "translation", "--data", tmp_path / "data", "--out", run,
        *TINY_TRANSLATION, "eval_every=1", "max_steps=1",
    )  # fmt: skip
    assert code == 0, err
    return run


def test_resume_after_the_data_moved_says_how_and_then_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = one_step_run(tmp_path, capsys)  # trained on tmp_path / "data"
    (tmp_path / "data").rename(tmp_path / "moved")
    before = (run / "config.json").read_text()
    code, _, err = qkv(capsys, "train", "--resume", run, "max_steps=2")
    assert code == 2 and f"qkv train --resume {run} data_dir=NEW" in err, err
    code, _, err = qkv(capsys, "train", "--resume", run, f"data_dir={tmp_path / 'nope'}")
    assert code == 2 and "nope is gone" in err, err
    code, _, err = qkv(
        capsys, "train", "--resume", run, f"data_dir={tmp_path / 'moved'}", "d_model=8"
    )
    assert code == 2 and "not: d_model" in err, err
    assert (run / "config.json").read_text() == before  # a refused resume changes nothing
    moved = f"data_dir={tmp_path / 'moved'}"
    code, _, err = qkv(capsys, "train", "--resume", run, "max_steps=2", moved)
    assert code == 0, err
    assert json.loads((run / "config.json").read_text())["data"]["data_dir"] == str(
        tmp_path / "moved"
    )
    code, _, err = qkv(capsys, "train", "--resume", run, "vocab_size=50")
    assert code == 2 and "not: vocab_size" in err, err


def test_resume_refuses_other_data_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = one_step_run(tmp_path, capsys)  # trained on tmp_path / "data"
    other = shutil.copytree(tmp_path / "data", tmp_path / "other")
    valid = other / "val.en"
    lines = valid.read_text().splitlines()
    valid.write_text("\n".join([lines[1], lines[0], *lines[2:]]) + "\n")  # two lines swapped
    before = (run / "config.json").read_text()
    code, _, err = qkv(capsys, "train", "--resume", run, f"data_dir={other}", "max_steps=2")
    assert code == 2, err
    assert f"{valid}: does not hold the text this run was trained on" in err, err
    assert (run / "config.json").read_text() == before


def test_a_resume_refused_for_its_checkpoints_keeps_the_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = one_step_run(tmp_path, capsys)
    shutil.rmtree(run / "checkpoints")  # the best weights stay: nothing to resume from
    before = (run / "config.json").read_text()
    code, _, err = qkv(capsys, "train", "--resume", run, "lr=0.9", "weight_decay=0.5")
    assert code == 2 and "no complete checkpoint to resume from" in err, err
    assert (run / "config.json").read_text() == before


def test_a_resume_with_other_batches_says_what_it_does_to_the_epoch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = one_step_run(tmp_path, capsys)
    code, out, err = qkv(capsys, "train", "--resume", run, "max_steps=2", "seed=5")
    assert code == 0 and "note: a new seed makes other batches" in out, err
    code, out, err = qkv(capsys, "train", "--resume", run, "max_steps=3", "lr=0.01")
    assert code == 0 and "makes other batches" not in out, err


def test_resume_of_a_classifier_refuses_other_data(
    review_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = shutil.copytree(review_run, tmp_path / "run")
    before = (run / "config.json").read_text()
    other = reviews(tmp_path / "other.jsonl", count=26)
    code, _, err = qkv(capsys, "train", "--resume", run, f"train_file={other}", "max_steps=3")
    assert code == 2 and f"{other}: does not hold the text this run was trained on" in err, err
    code, _, err = qkv(capsys, "train", "--resume", run, f"valid_file={other}", "max_steps=3")
    assert code == 2 and "trained without a valid_file" in err, err
    assert (run / "config.json").read_text() == before
    same = shutil.copy(json.loads(before)["data"]["train_file"], tmp_path / "moved.jsonl")
    code, _, err = qkv(capsys, "train", "--resume", run, f"train_file={same}", "max_steps=3")
    assert code == 0, err
    assert json.loads((run / "config.json").read_text())["data"]["train_file"] == str(same)


def test_a_run_is_readable_as_the_umask_allows(translation_run: Path) -> None:
    mode = 0o666 & ~UMASK
    files = ["model.safetensors", "tokenizer.json", "config.json", "cache/tokens.safetensors"]
    files += [str(p.relative_to(translation_run)) for p in translation_run.glob("checkpoints/*/*")]
    assert len(files) > 4
    for name in files:
        assert (translation_run / name).stat().st_mode & 0o777 == mode, name


def test_stdin_is_read_as_a_file_is(
    translation_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = "\ufeffein Hund läuft\nzwei Katzen\n".encode()
    (tmp_path / "in.de").write_bytes(text)
    code, from_file, err = qkv(capsys, "translate", translation_run, "--input", tmp_path / "in.de")
    assert code == 0, err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text)))
    code, from_stdin, err = qkv(capsys, "translate", translation_run)
    assert code == 0, err
    assert from_stdin == from_file and len(from_file.splitlines()) == 2
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"gut\nein \xff\n")))
    code, _, err = qkv(capsys, "translate", translation_run)
    assert err == "qkv: <stdin>:2: invalid UTF-8 (byte 0xff at column 5)\n"


def test_stdin_of_only_a_byte_order_mark_has_no_lines(
    translation_run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for data in ("\ufeff".encode(), gzip.compress(b"")):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
        assert qkv(capsys, "translate", translation_run) == (0, "", "")


def test_dev_stdout_and_pipes_are_written_as_the_shell_opened_them(
    translation_run: Path, tmp_path: Path
) -> None:
    """`--output /dev/stdout` into a pipe or appended to a file (`>>`), and `--input` from a
    pipe (/dev/stdin, a named pipe), which is read once."""
    source = TRANSLATION / "val.de"
    command = [str(QKV), "translate", str(translation_run), "--beam", "1"]
    expected = subprocess.run(
        [*command, "--input", str(source)], capture_output=True, text=True, check=True
    ).stdout
    piped = subprocess.run(
        [*command, "--input", "/dev/stdin", "--output", "/dev/stdout"],
        input=source.read_text(encoding="utf-8"),
        capture_output=True,
        text=True,
    )
    assert (piped.returncode, piped.stdout, piped.stderr) == (0, expected, "")
    log = tmp_path / "log.txt"
    log.write_text("before\n", encoding="utf-8")
    with log.open("a") as appended:
        subprocess.run([*command, "--input", str(source), "--output", "/dev/stdout"],
                       stdout=appended, check=True)  # fmt: skip
    assert log.read_text(encoding="utf-8") == "before\n" + expected
    grown = tmp_path / "grown.txt"  # `--input F >> F` would read what it writes, forever
    shutil.copy(source, grown)
    with grown.open("a") as appended:
        refused = subprocess.run([*command, "--input", str(grown)], stdout=appended,
                                 stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
    assert refused.returncode == 2 and "<stdout>: is the input file" in refused.stderr
    assert grown.read_bytes() == source.read_bytes()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with subprocess.Popen(["cp", str(source), str(fifo)]):
        found = subprocess.run(
            [*command, "--input", str(fifo)], capture_output=True, text=True, timeout=120
        )
    assert (found.returncode, found.stdout) == (0, expected), found.stderr


def test_an_input_named_as_the_output_s_temporary_file_is_left_alone(
    translation_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = tmp_path / "out.txt.tmp", tmp_path / "out.txt"
    shutil.copy(TRANSLATION / "val.de", source)
    assert qkv(capsys, "translate", translation_run, "--input", source, "--output", out)[0] == 0
    lines = (TRANSLATION / "val.de").read_bytes()
    assert source.read_bytes() == lines
    assert len(out.read_text(encoding="utf-8").splitlines()) == len(lines.splitlines())


def test_a_run_that_fails_before_it_begins_leaves_no_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one_label = tmp_path / "one.jsonl"
    one_label.write_text('{"text": "good", "label": 1}\n' * 30)
    code, _, err = qkv(
        capsys, "train", "classification", "--train", one_label, "--out", tmp_path / "new", *TINY
    )
    assert code == 2 and "needs at least 2 labels" in err, err
    assert not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()
    code, _, err = qkv(
        capsys, "train", "classification", "--train", one_label, "--out", tmp_path / "mine", *TINY
    )
    assert code == 2 and (tmp_path / "mine").is_dir()  # the user's own directory stays


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_output_the_file_system_refuses_is_found_even_for_root(tmp_path: Path) -> None:
    from qkv.commands.io import check_output
    from qkv.errors import DataError

    with pytest.raises(DataError, match=r"/proc/out\.en: cannot write"):
        check_output("/proc/out.en")  # os.access says yes to root here
    check_output(str(tmp_path / "out.en"))
    assert list(tmp_path.iterdir()) == []  # the probe is gone


def test_evaluate_takes_and_records_the_length_penalty(
    translation_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = TRANSLATION.parent.parent / "text"
    files = ["--src", corpus / "src.de", "--ref", corpus / "ref.en", "--json", "--beam", "2"]
    code, out, err = qkv(capsys, "evaluate", translation_run, *files, "--alpha", "0.0")
    assert code == 0, err
    assert json.loads(out)["alpha"] == 0.0
    code, _, err = qkv(capsys, "evaluate", translation_run, *files, "--alpha", "nan")
    assert code == 2 and "alpha must be between 0 and 10" in err, err


def test_translate_and_evaluate_take_the_output_length_cap(
    translation_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = TRANSLATION.parent.parent / "text"
    source = corpus / "src.de"
    code, uncapped, err = qkv(capsys, "translate", translation_run, "--input", source)
    assert code == 0, err
    assert max(len(line.split()) for line in uncapped.splitlines()) > 2
    cap = ["--max-len-a", "0", "--max-len-b", "2"]
    code, capped, err = qkv(capsys, "translate", translation_run, "--input", source, *cap)
    assert code == 0, err
    lines = capped.splitlines()
    assert len(lines) == len(uncapped.splitlines())
    assert max(len(line.split()) for line in lines) <= 2
    files = ["--src", source, "--ref", corpus / "ref.en", "--json", "--beam", "1"]
    code, out, err = qkv(capsys, "evaluate", translation_run, *files, "--max-len-b", "4")
    assert code == 0, err
    assert (json.loads(out)["max_len_a"], json.loads(out)["max_len_b"]) == (1.5, 4)
    code, _, err = qkv(capsys, "translate", translation_run, "--input", source, "--max-len-a", "-1")
    assert (
        code == 2 and err == "qkv: max_len_a and max_len_b must be >= 0 and finite, got -1.0, 10\n"
    )


def test_translate_evaluate_and_classify_take_a_device(
    translation_run: Path,
    review_run: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    corpus = TRANSLATION.parent.parent / "text"
    source = ["--input", corpus / "src.de", "--beam", "1"]
    code, on_cpu, err = qkv(capsys, "translate", translation_run, *source, "--device", "cpu")
    assert code == 0 and len(on_cpu.splitlines()) == 8, err
    files = ["--src", corpus / "src.de", "--ref", corpus / "ref.en", "--json"]
    code, out, err = qkv(capsys, "evaluate", translation_run, *files, "--device", "cpu")
    assert code == 0 and "bleu" in json.loads(out), err
    texts = tmp_path / "texts.txt"
    texts.write_text("a warm film\na dull film\n")
    code, out, err = qkv(capsys, "classify", review_run, "--input", texts, "--device", "cpu")
    assert code == 0 and len(out.splitlines()) == 2, err
    code, _, err = qkv(capsys, "translate", translation_run, *source, "--device", "tpu")
    assert code == 2 and err.startswith("qkv: ") and "use auto, cpu or cuda" in err, err
    # Where torch sees a GPU, --workers above 1 with --device auto decode on the CPU.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    code, in_workers, err = qkv(capsys, "translate", translation_run, *source, "--workers", "2")
    assert code == 0, err
    assert in_workers == on_cpu


def test_a_run_being_trained_is_not_trained_by_a_second_process(
    translation_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from qkv.run import run_lock

    run = tmp_path / "run"
    shutil.copytree(translation_run, run)
    with run_lock(run):  # as a training process holds it
        code, _, err = qkv(capsys, "train", "--resume", run, "max_steps=3")
        assert code == 2 and f"{run} is being trained by process " in err, err
        new = tmp_path / "new"
        with run_lock(new):
            code, _, err = qkv(
                capsys, "train", "translation", "--data", TRANSLATION, "--out", new,
                *TINY_TRANSLATION,
            )  # fmt: skip
            assert code == 2 and "is being trained by" in err, err
    code, _, err = qkv(capsys, "train", "--resume", run, "max_steps=3")
    assert code == 0, err


def test_a_run_without_checkpoints_but_with_weights_says_how_to_start_again(
    translation_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(translation_run, run)
    shutil.rmtree(run / "checkpoints")  # as when the first checkpoint could not be written
    code, _, err = qkv(capsys, "train", "--resume", run)
    assert code == 2 and "move it away and resume again" in err, err
    (run / "model.safetensors").rename(tmp_path / "kept.safetensors")
    code, _, err = qkv(capsys, "train", "--resume", run, "max_steps=2")
    assert code == 0, err


def test_training_with_stderr_closed_trains_and_saves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stderr", None)  # what Python makes of `2>&-`
    run = tmp_path / "run"
    args = ["train", "translation", "--data", str(TRANSLATION), "--out", str(run)]
    assert main([*args, *TINY_TRANSLATION, "eval_every=2"]) == 0
    assert (run / "model.safetensors").is_file() and list((run / "checkpoints").iterdir())
