"""Every command over the bad-input corpus: exit code 2 and one line on stderr that names the file.

The corpus lives in tests/corpus/ (written by tests/corpus/make_corpus.py). Damaged run
directories are made here from a freshly trained tiny run, since they need real weights.
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from qkv.cli import main
from qkv.training import checkpoint as ckpt

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
TRANSLATION, TEXT, LABELLED = CORPUS / "translation", CORPUS / "text", CORPUS / "labelled"
QKV = Path(sys.executable).with_name("qkv")

needs_classification = pytest.mark.skipif(
    importlib.util.find_spec("qkv.commands.classify") is None
    or importlib.util.find_spec("qkv.tasks.classification") is None,
    reason="classification commands not available",
)


pytestmark = pytest.mark.usefixtures("one_thread")


def cli(*argv: str | Path) -> int:
    return main([str(a) for a in argv])


def qkv(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str]:
    """Run the command line in this process; its exit code and stderr."""
    capsys.readouterr()
    code = cli(*argv)
    return code, capsys.readouterr().err


def assert_one_line(err: str, path: str | Path, line: int | None = None) -> None:
    """stderr is exactly one line, `qkv: PATH[:LINE]: ...`."""
    assert err.endswith("\n") and err.count("\n") == 1, repr(err)
    assert err.startswith("qkv: "), repr(err)
    where = f"{path}:{line}: " if line is not None else f"{path}"
    assert where in err, f"{where!r} not in {err!r}"


def assert_fails(code: int, err: str, path: str | Path, line: int | None = None) -> None:
    assert code == 2, err
    assert_one_line(err, path, line)


@pytest.fixture(scope="module")
def translation_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("translation") / "run"
    data = TRANSLATION / "good"
    tiny = ["--preset", "tiny", "vocab_size=100", "max_tokens=256", "max_steps=4", "eval_every=2"]
    assert cli("train", "translation", "--data", data, "--out", run, *tiny) == 0
    return run


@pytest.fixture(scope="module")
def classification_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("classification") / "run"
    args = ["--preset", "tiny", "vocab_size=100", "max_steps=2", "eval_every=2"]
    train = str(LABELLED / "good.jsonl")
    assert main(["train", "classification", "--train", train, "--out", str(run), *args]) == 0
    return run


# --------------------------------------------------------------------------- training data

TRAIN_DATA = {
    "missing directory": ("nope", "nope", None),
    "line counts differ": ("mismatch", "mismatch/train.de", None),
    "validation line counts differ": ("val_mismatch", "val_mismatch/val.de", None),
    "empty line": ("empty_line", "empty_line/train.en", 3),
    "blank line": ("blank_line", "blank_line/val.de", 2),
    "bad UTF-8": ("bad_utf8", "bad_utf8/train.de", 2),
    "truncated gzip": ("truncated_gz", "truncated_gz/train.de.gz", None),
    ".gz that is not gzip": ("not_gzip", "not_gzip/train.de.gz", None),
    "empty file": ("empty_file", "empty_file/train.en", None),
    "no validation files": ("no_val", "no_val", None),
    "a file, not a directory": ("good/train.de", "good/train.de", None),
    "train.de is a directory": ("dir_as_file", "dir_as_file/train.de", None),
    "lines ended by CR alone": ("cr_only", "cr_only/train.de", None),
}


@pytest.mark.parametrize("case", TRAIN_DATA.values(), ids=TRAIN_DATA.keys())
def test_train_translation_on_bad_data(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, case: tuple[str, str, int | None]
) -> None:
    data, at_fault, line = case
    code, err = qkv(
        capsys, "train", "translation", "--data", TRANSLATION / data, "--out", tmp_path / "run"
    )
    assert_fails(code, err, TRANSLATION / at_fault, line)


BAD_SETTINGS = {
    "unknown preset": (["--preset", "huge"], "unknown translation preset 'huge'"),
    "bad value": (["threads=many"], "threads: cannot read 'many' as int"),
    "unknown setting": (["d_modle=64"], "unknown setting(s): d_modle (did you mean d_model?)"),
    "invalid value": (["eval_every=0"], "eval_every must be at least 1"),
    "invalid model": (["d_model=30", "n_heads=4"], "d_model (30) must be divisible by n_heads (4)"),
}


@pytest.mark.parametrize("case", BAD_SETTINGS.values(), ids=BAD_SETTINGS.keys())
def test_train_with_bad_settings(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, case: tuple[list[str], str]
) -> None:
    extra, message = case
    data = TRANSLATION / "good"
    code, err = qkv(capsys, "train", "translation", "--data", data, "--out", tmp_path / "r", *extra)
    assert code == 2
    assert err.startswith(f"qkv: {message}") and err.count("\n") == 1, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_train_on_a_missing_gpu_fails_before_any_work(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data, out = TRANSLATION / "good", tmp_path / "run"
    code, err = qkv(capsys, "train", "translation", "--data", data, "--out", out, "device=cuda")
    assert code == 2
    assert (
        err.startswith("qkv: device cuda asked for, but torch sees no CUDA device")
        and err.count("\n") == 1
    )
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_resume_on_a_missing_gpu_says_how_to_go_on(
    capsys: pytest.CaptureFixture[str], translation_run: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(translation_run, run)
    code, err = qkv(capsys, "train", "--resume", run, "device=cuda")
    assert code == 2
    assert (
        "device cuda asked for, but torch sees no CUDA device" in err and "use auto or cpu" in err
    )
    assert cli("train", "--resume", run, "device=cpu", "max_steps=6") == 0


def test_train_refuses_to_overwrite_a_run(
    capsys: pytest.CaptureFixture[str], translation_run: Path
) -> None:
    data = TRANSLATION / "good"
    code, err = qkv(capsys, "train", "translation", "--data", data, "--out", translation_run)
    assert_fails(code, err, translation_run)
    assert f"--resume {translation_run}" in err


# --------------------------------------------------------------------------- translate / evaluate


INPUTS = {
    "bad UTF-8": ("bad_utf8.de", 3),
    "empty file": ("empty.de", None),
    "truncated gzip": ("truncated.de.gz", None),
    "missing file": ("missing.de", None),
    "a directory": (".", None),
    "lines ended by CR alone": ("cr_only.de", None),
}


@pytest.mark.parametrize("case", INPUTS.values(), ids=INPUTS.keys())
def test_translate_bad_input(
    capsys: pytest.CaptureFixture[str], translation_run: Path, case: tuple[str, int | None]
) -> None:
    name, line = case
    path = TEXT / name
    code, err = qkv(capsys, "translate", translation_run, "--input", path)
    assert_fails(code, err, path if name != "." else TEXT, line)


def test_translate_bad_stdin(
    capsys: pytest.CaptureFixture[str], translation_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ein hund\nzwei\n\xff\n")))
    code, err = qkv(capsys, "translate", translation_run)
    assert_fails(code, err, "<stdin>", 3)


def test_translate_reads_gzipped_stdin(
    capsys: pytest.CaptureFixture[str], translation_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cli("translate", translation_run, "--input", TEXT / "src.de") == 0
    plain = capsys.readouterr().out
    packed = gzip.compress((TEXT / "src.de").read_bytes())
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(packed)))
    assert cli("translate", translation_run) == 0
    assert capsys.readouterr().out == plain


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--beam", "0"], "beam size must be between 1 and 256"),
        (["--beam", "100000"], "beam size must be between 1 and 256"),
        (["--alpha", "500"], "alpha must be between 0 and 10"),
        (["--alpha", "nan"], "alpha must be between 0 and 10"),
        (["--alpha=-1"], "alpha must be between 0 and 10"),
        (["--sample", "--temperature", "nan"], "temperature must be a number > 0"),
        (["--sample", "--top-p", "0"], "top_p"),
        (["--workers", "-1"], "workers must be >= 0"),
        (["--top-k", "5"], "--top-k is for --sample; without it qkv searches"),
        (["--beam", "1", "--temperature", "0.5"], "--temperature is for --sample"),
        (["--seed", "5"], "--seed is for --sample"),
        (["--sample", "--beam", "3"], "--beam is for beam search, which --sample replaces"),
        (["--sample", "--alpha", "1"], "--alpha is for beam search"),
    ],
)
def test_translate_refuses_options_out_of_range(
    capsys: pytest.CaptureFixture[str], translation_run: Path, option: list[str], message: str
) -> None:
    code, err = qkv(capsys, "translate", translation_run, "--input", TEXT / "src.de", *option)
    assert code == 2, err
    assert err.startswith("qkv: ") and err.count("\n") == 1 and message in err, repr(err)


def test_translate_to_unwritable_output_fails_before_decoding(
    capsys: pytest.CaptureFixture[str],
    translation_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from qkv.inference.translator import Translator

    def no_decoding(*args: object, **kwargs: object) -> None:
        raise AssertionError("decoded before finding that the output cannot be written")

    monkeypatch.setattr(Translator, "hypotheses", no_decoding)
    for out in (tmp_path / "missing" / "out.en", tmp_path):
        code, err = qkv(
            capsys, "translate", translation_run, "--input", TEXT / "src.de", "--output", out
        )
        assert_fails(code, err, out)


def test_translate_and_evaluate_work_on_the_good_files(
    capsys: pytest.CaptureFixture[str], translation_run: Path, tmp_path: Path
) -> None:
    out, out_workers = tmp_path / "out.en", tmp_path / "out_workers.en"
    assert cli("translate", translation_run, "--input", TEXT / "src.de", "--output", out) == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == 8
    options = ["--input", TEXT / "src.de", "--output", out_workers, "--workers", "2"]
    assert cli("translate", translation_run, *options) == 0
    assert out_workers.read_text(encoding="utf-8") == out.read_text(encoding="utf-8")
    capsys.readouterr()
    src, ref = TEXT / "src.de", TEXT / "ref.en"
    scores = []
    for workers in ("1", "2"):
        options = ["--src", src, "--ref", ref, "--json", "--beam", "2", "--workers", workers]
        assert cli("evaluate", translation_run, *options) == 0
        scores.append(json.loads(capsys.readouterr().out))
    assert "bleu" in scores[0] and scores[0] == scores[1]


def test_translate_and_evaluate_in_bf16(
    capsys: pytest.CaptureFixture[str], translation_run: Path
) -> None:
    assert cli("translate", translation_run, "--input", TEXT / "src.de", "--bf16") == 0
    assert len(capsys.readouterr().out.splitlines()) == 8
    options = ["--src", TEXT / "src.de", "--ref", TEXT / "ref.en", "--json", "--bf16"]
    assert cli("evaluate", translation_run, *options) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["bf16"] is True and 0.0 <= scores["bleu"] <= 100.0


def test_line_ends_and_invisible_lines_do_not_reach_the_model(
    capsys: pytest.CaptureFixture[str], translation_run: Path
) -> None:
    outputs = []
    for name in ("src.de", "crcrlf.de", "invisible.de"):
        assert cli("translate", translation_run, "--input", TEXT / name) == 0
        outputs.append(capsys.readouterr().out.split("\n")[:-1])
    plain, converted_twice, invisible = outputs
    assert converted_twice == plain and "\r" not in "".join(plain)
    assert invisible[1:3] == ["", ""] and len(invisible) == 4
    assert [invisible[0], invisible[3]] == [plain[0], plain[3]]


def test_a_validation_pair_longer_than_the_model_is_cut_to_fit(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    tiny = ["--preset", "tiny", "vocab_size=100", "max_tokens=512", "max_steps=2", "eval_every=2"]
    data, run = TRANSLATION / "long_val", tmp_path / "run"
    code, err = qkv(capsys, "train", "translation", "--data", data, "--out", run, *tiny)
    assert code == 0, err
    assert (run / "model.safetensors").is_file()


def test_attention_refuses_text_that_is_not_utf8(
    capsys: pytest.CaptureFixture[str], translation_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "a.png"
    code, err = qkv(capsys, "attention", translation_run, "ein \udcff hund", "--out", out)
    assert code == 2 and err == "qkv: the sentence to draw attention for is not valid UTF-8 text\n"
    assert not out.exists()


def test_sampling_is_reproducible_by_its_seed(
    capsys: pytest.CaptureFixture[str], translation_run: Path
) -> None:
    outputs = []
    for seed in ("1", "1", "2"):
        options = ["--input", TEXT / "src.de", "--sample", "--temperature", "5", "--seed", seed]
        assert cli("translate", translation_run, *options) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] != outputs[2]
    assert len(outputs[0].splitlines()) == 8


def test_a_long_input_is_translated_in_parts_as_it_would_be_whole(
    capsys: pytest.CaptureFixture[str], translation_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qkv.commands import translate
    from qkv.inference.translator import Translator

    options = ["--input", TEXT / "src.de", "--sample", "--temperature", "5", "--seed", "3"]
    assert cli("translate", translation_run, *options) == 0
    whole = capsys.readouterr().out
    sentences = (TEXT / "src.de").read_text(encoding="utf-8").splitlines()
    translator = Translator.load(translation_run, "cpu")
    assert whole.splitlines() == translator.translate(
        sentences, sampling=True, temperature=5.0, seed=3
    )
    parts: list[int] = []
    hypotheses = Translator.hypotheses

    def counted(self: Translator, sentences: list[str], **options: Any) -> Any:
        parts.append(len(sentences))
        return hypotheses(self, sentences, **options)

    monkeypatch.setattr(translate, "CHUNK_LINES", 3)
    monkeypatch.setattr(Translator, "hypotheses", counted)
    assert cli("translate", translation_run, *options) == 0
    assert capsys.readouterr().out == whole and parts == [3, 3, 2]


def test_an_input_that_fails_part_way_leaves_the_output_file_as_it_was(
    capsys: pytest.CaptureFixture[str],
    translation_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from qkv.commands import translate

    monkeypatch.setattr(translate, "CHUNK_LINES", 2)  # the first two lines translate first
    bad, out = tmp_path / "in.de", tmp_path / "out.en"
    bad.write_bytes(b"ein Hund\nzwei Katzen\ndrei\n\xff\n")
    out.write_text("before\n", encoding="utf-8")
    code, err = qkv(capsys, "translate", translation_run, "--input", bad, "--output", out)
    assert_fails(code, err, bad, 4)
    assert out.read_text(encoding="utf-8") == "before\n"
    assert sorted(tmp_path.iterdir()) == [bad, out]  # no temporary file left


EVALUATE = {
    "line counts differ": ("src.de", "ref_short.en", "src.de", None),
    "empty reference line": ("src.de", "ref_empty_line.en", "ref_empty_line.en", 5),
    "bad UTF-8 source": ("bad_utf8.de", "ref.en", "bad_utf8.de", 3),
    "missing reference": ("src.de", "missing.en", "missing.en", None),
}


@pytest.mark.parametrize("case", EVALUATE.values(), ids=EVALUATE.keys())
def test_evaluate_bad_input(
    capsys: pytest.CaptureFixture[str],
    translation_run: Path,
    case: tuple[str, str, str, int | None],
) -> None:
    src, ref, at_fault, line = case
    code, err = qkv(capsys, "evaluate", translation_run, "--src", TEXT / src, "--ref", TEXT / ref)
    assert_fails(code, err, TEXT / at_fault, line)


def test_evaluate_without_references(
    capsys: pytest.CaptureFixture[str], translation_run: Path
) -> None:
    code, err = qkv(capsys, "evaluate", translation_run, "--src", TEXT / "src.de")
    assert code == 2
    assert err == "qkv: evaluate on a translation run needs --src FILE and --ref FILE\n"


def test_evaluate_refuses_the_other_tasks_options(
    capsys: pytest.CaptureFixture[str], translation_run: Path
) -> None:
    code, err = qkv(
        capsys, "evaluate", translation_run, "--src", TEXT / "src.de", "--ref", TEXT / "ref.en",
        "--data", LABELLED / "good.jsonl",
    )  # fmt: skip
    assert code == 2
    assert (
        err == f"qkv: --data is for classification runs; {translation_run} is a translation run\n"
    )


@needs_classification
@pytest.mark.parametrize("option", [["--beam", "3"], ["--workers", "2"], ["--bf16"]])
def test_evaluate_on_a_classifier_refuses_decoding_options(
    capsys: pytest.CaptureFixture[str], classification_run: Path, option: list[str]
) -> None:
    code, err = qkv(
        capsys, "evaluate", classification_run, "--data", LABELLED / "good.jsonl", *option
    )
    assert code == 2 and f"qkv: {option[0]} is for translation runs" in err, err


# --------------------------------------------------------------------------- damaged runs


def edit_config(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        config = json.loads((run / "config.json").read_text())
        change(config)
        (run / "config.json").write_text(json.dumps(config))

    return apply


def truncate(name: str, keep: float = 0.5) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        path = run / name
        path.write_bytes(path.read_bytes()[: int(path.stat().st_size * keep)])

    return apply


def replace(name: str, data: bytes) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        (run / name).write_bytes(data)

    return apply


def remove(name: str) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        (run / name).unlink()

    return apply


def not_finite(name: str) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        tensors = load_file(str(run / name))
        first = next(key for key, tensor in tensors.items() if tensor.is_floating_point())
        tensors[first].view(-1)[0] = float("inf")
        save_file(tensors, str(run / name))

    return apply


def each_checkpoint(damage: Callable[[Path], None]) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        for directory in (run / "checkpoints").iterdir():
            damage(directory)

    return apply


# name: (damage, what translate/evaluate name, what `train --resume` names), relative to the run;
# None where the command does not read the damaged file and works.
RUN_DAMAGE: dict[str, tuple[Callable[[Path], None], str | None, str | None]] = {
    "newer run format": (
        edit_config(lambda c: c.update(format_version=99)),
        "config.json",
        "config.json",
    ),
    "d_model changed": (
        edit_config(lambda c: c["model"].update(d_model=128)),
        "model.safetensors",
        "checkpoints/step-0000004/model.safetensors",
    ),
    "unknown task": (
        edit_config(lambda c: c.update(task="summarization")),
        "config.json",
        "config.json",
    ),
    "n_heads does not divide d_model": (
        edit_config(lambda c: c["model"].update(n_heads=3)),
        "config.json",
        "config.json",
    ),
    "d_model not an integer": (
        edit_config(lambda c: c["model"].update(d_model=64.0)),
        "config.json",
        "config.json",
    ),
    "unknown model field": (
        edit_config(lambda c: c["model"].update(heads=4)),
        "config.json",
        "config.json",
    ),
    "train section not an object": (
        edit_config(lambda c: c.update(train=[1])),
        "config.json",
        "config.json",
    ),
    "config truncated": (truncate("config.json"), "config.json", "config.json"),
    "config not UTF-8": (replace("config.json", b"\xff\xfe{}"), "config.json", "config.json"),
    "config missing": (remove("config.json"), "config.json", "config.json"),
    "weights truncated": (truncate("model.safetensors"), "model.safetensors", None),
    "weights header only": (truncate("model.safetensors", 0.001), "model.safetensors", None),
    "weights missing": (remove("model.safetensors"), "model.safetensors", None),
    "weights not finite": (not_finite("model.safetensors"), "model.safetensors", None),
    "tokenizer garbage": (
        replace("tokenizer.json", b"{garbage"),
        "tokenizer.json",
        "tokenizer.json",
    ),
    "tokenizer not a tokenizer": (
        replace("tokenizer.json", b'{"version": "1.0"}'),
        "tokenizer.json",
        "tokenizer.json",
    ),
    "tokenizer missing": (remove("tokenizer.json"), "tokenizer.json", "tokenizer.json"),
    "vocabulary size differs": (  # "RUN: tokenizer has 100 tokens, the model 101"
        edit_config(lambda c: c["model"].update(vocab_size=c["model"]["vocab_size"] + 1)),
        "",
        "checkpoints/step-0000004/model.safetensors",
    ),
    "checkpoint truncated": (each_checkpoint(truncate("model.safetensors")), None, "checkpoints"),
    "checkpoint from a newer qkv": (
        each_checkpoint(
            lambda d: (d / "state.json").write_text(
                json.dumps({**json.loads((d / "state.json").read_text()), "format_version": 9})
            )
        ),
        None,
        "checkpoints",
    ),
}


def damaged(run: Path, tmp_path: Path, damage: Callable[[Path], None]) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    damage(copy)
    return copy


@pytest.mark.parametrize("case", RUN_DAMAGE.values(), ids=RUN_DAMAGE.keys())
def test_damaged_translation_run(
    capsys: pytest.CaptureFixture[str],
    translation_run: Path,
    tmp_path: Path,
    case: tuple[Callable[[Path], None], str | None, str | None],
) -> None:
    damage, at_fault, at_fault_on_resume = case
    run = damaged(translation_run, tmp_path, damage)
    if at_fault is not None:
        code, err = qkv(capsys, "translate", run, "--input", TEXT / "src.de")
        assert_fails(code, err, run / at_fault)
        code, err = qkv(capsys, "evaluate", run, "--src", TEXT / "src.de", "--ref", TEXT / "ref.en")
        assert_fails(code, err, run / at_fault)
    if at_fault_on_resume is not None:
        code, err = qkv(capsys, "train", "--resume", run)
        assert_fails(code, err, run / at_fault_on_resume)


def test_a_run_stopped_before_its_first_weights_says_how_to_go_on(
    capsys: pytest.CaptureFixture[str], translation_run: Path, tmp_path: Path
) -> None:
    run = damaged(translation_run, tmp_path, remove("model.safetensors"))
    code, err = qkv(capsys, "translate", run, "--input", TEXT / "src.de")
    assert_fails(code, err, run / "model.safetensors")
    assert f"continue it with: qkv train --resume {run}" in err


def test_resume_falls_back_to_the_last_good_checkpoint(
    capsys: pytest.CaptureFixture[str], translation_run: Path, tmp_path: Path
) -> None:
    run = damaged(translation_run, tmp_path, truncate("checkpoints/step-0000004/model.safetensors"))
    capsys.readouterr()
    assert cli("train", "--resume", run) == 0
    out = capsys.readouterr().out
    bad = run / "checkpoints" / "step-0000004" / "model.safetensors"
    assert f"warning: skipping bad checkpoint: {bad}: checksum mismatch" in out
    assert f"resuming from {run / 'checkpoints' / 'step-0000002'} (step 2" in out
    assert ckpt.verify_checkpoint(run / "checkpoints" / "step-0000004")["progress"]["step"] == 4


@pytest.mark.parametrize("command", ["translate", "evaluate", "train --resume"])
def test_missing_run_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    code, err = qkv(capsys, *command.split(), tmp_path / "nothing")
    assert_fails(code, err, tmp_path / "nothing")
    assert "run directory not found" in err


# --------------------------------------------------------------------------- classification

LABELLED_FILES = {
    "malformed JSON": ("malformed.jsonl", 3),
    "JSON list, not object": ("not_object.jsonl", 2),
    "missing field": ("missing_field.jsonl", 3),
    "empty label": ("empty_label.jsonl", 4),
    "empty text": ("empty_text.jsonl", 2),
    "boolean label": ("bool_label.jsonl", 3),
    "bad UTF-8": ("bad_utf8.jsonl", 3),
    "truncated gzip": ("truncated.jsonl.gz", None),
    "missing CSV column": ("missing_column.csv", 1),
    "CSV row with extra fields": ("wrong_fields.csv", 3),
    "CSV unclosed quote": ("unclosed_quote.csv", 3),
    "missing TSV column": ("missing_column.tsv", 1),
    "unknown format": ("unknown_format.xml", None),
    "no records": ("empty.jsonl", None),
    "missing file": ("missing.jsonl", None),
    "lone surrogate in a text": ("surrogate_text.jsonl", 3),
    "lone surrogate in a label": ("surrogate_label.jsonl", 4),
    "invisible text": ("invisible_text.jsonl", 3),
    "text empty once cleaned": ("breaks_only.csv", 5),
}
TEXT_ONLY_OK = {"missing_field.jsonl", "empty_label.jsonl", "bool_label.jsonl"}
TEXT_ONLY_OK |= {"surrogate_label.jsonl"}
TEXT_ONLY_OK |= {"missing_column.tsv", "unknown_format.xml"}  # has "text"; plain lines


@needs_classification
@pytest.mark.parametrize("case", LABELLED_FILES.values(), ids=LABELLED_FILES.keys())
def test_train_classification_on_bad_data(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, case: tuple[str, int | None]
) -> None:
    name, line = case
    path = LABELLED / name
    code, err = qkv(capsys, "train", "classification", "--train", path, "--out", tmp_path / "a")
    assert_fails(code, err, path, line)
    good = LABELLED / "good.jsonl"
    code, err = qkv(
        capsys, "train", "classification", "--train", good, "--valid", path, "--out", tmp_path / "b"
    )
    assert_fails(code, err, path, line)


@needs_classification
def test_train_classification_with_unknown_validation_label(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = LABELLED / "unknown_label.jsonl"
    good = LABELLED / "good.jsonl"
    code, err = qkv(
        capsys, "train", "classification", "--train", good, "--valid", path, "--out", tmp_path / "r"
    )
    assert_fails(code, err, path)
    assert "neutral" in err


@needs_classification
@pytest.mark.parametrize("case", LABELLED_FILES.values(), ids=LABELLED_FILES.keys())
def test_classify_and_evaluate_bad_data(
    capsys: pytest.CaptureFixture[str], classification_run: Path, case: tuple[str, int | None]
) -> None:
    name, line = case
    path = LABELLED / name
    code, err = qkv(capsys, "evaluate", classification_run, "--data", path)
    assert_fails(code, err, path, line)
    code, err = qkv(capsys, "classify", classification_run, "--input", path)
    if name in TEXT_ONLY_OK:
        assert code == 0, err
    else:
        assert_fails(code, err, path, line)


@needs_classification
@pytest.mark.parametrize("name", ["good.jsonl", "lines.txt"])
def test_classify_works_in_parts_and_a_late_bad_line_leaves_the_output_as_it_was(
    capsys: pytest.CaptureFixture[str],
    classification_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
) -> None:
    from qkv.commands import classify

    texts = [json.loads(line)["text"] for line in (LABELLED / "good.jsonl").open()]
    path = LABELLED / name
    if name == "lines.txt":
        path = tmp_path / name
        path.write_text("".join(f"{text}\n" for text in texts), encoding="utf-8")
    out = tmp_path / "out.txt"
    assert cli("classify", classification_run, "--input", path, "--json", "--output", out) == 0
    whole = out.read_text(encoding="utf-8")
    assert [json.loads(line)["text"] for line in whole.splitlines()] == texts
    monkeypatch.setattr(classify, "CHUNK_TEXTS", 3)
    assert cli("classify", classification_run, "--input", path, "--json", "--output", out) == 0
    assert out.read_text(encoding="utf-8") == whole
    if name == "lines.txt":  # a blank line after the first three: found after they are done
        path.write_text("".join(f"{t}\n" for t in [*texts[:4], " ", *texts[4:]]), encoding="utf-8")
        code, err = qkv(capsys, "classify", classification_run, "--input", path, "--output", out)
        assert_fails(code, err, path, 5)
        assert out.read_text(encoding="utf-8") == whole


@needs_classification
def test_evaluate_unknown_label(
    capsys: pytest.CaptureFixture[str], classification_run: Path
) -> None:
    path = LABELLED / "unknown_label.jsonl"
    code, err = qkv(capsys, "evaluate", classification_run, "--data", path)
    assert_fails(code, err, path, 4)
    assert "unknown label 'neutral'" in err


@needs_classification
@pytest.mark.parametrize(
    "name",
    [
        "newer run format",
        "d_model changed",
        "d_model not an integer",
        "config truncated",
        "weights truncated",
        "tokenizer garbage",
    ],
)
def test_damaged_classification_run(
    capsys: pytest.CaptureFixture[str], classification_run: Path, tmp_path: Path, name: str
) -> None:
    damage, at_fault, _ = RUN_DAMAGE[name]
    assert at_fault is not None
    run = damaged(classification_run, tmp_path, damage)
    code, err = qkv(capsys, "classify", run, "--input", LABELLED / "good.jsonl")
    assert_fails(code, err, run / at_fault)
    code, err = qkv(capsys, "evaluate", run, "--data", LABELLED / "good.jsonl")
    assert_fails(code, err, run / at_fault)


CLASSIFICATION_DATA_DAMAGE = {
    "data max_len not an integer": edit_config(lambda c: c["data"].update(max_len="abc")),
    "labels one string": edit_config(lambda c: c["data"].update(labels="0,1")),
    "labels not strings": edit_config(lambda c: c["data"].update(labels=[0, 1])),
    "a label too many": edit_config(lambda c: c["data"]["labels"].append("neutral")),
    "a label named twice": edit_config(lambda c: c["data"].update(labels=["0", "0"])),
}


@needs_classification
@pytest.mark.parametrize(
    "damage", CLASSIFICATION_DATA_DAMAGE.values(), ids=CLASSIFICATION_DATA_DAMAGE.keys()
)
def test_classification_run_with_damaged_data_settings(
    capsys: pytest.CaptureFixture[str],
    classification_run: Path,
    tmp_path: Path,
    damage: Callable[[Path], None],
) -> None:
    run = damaged(classification_run, tmp_path, damage)
    for command in (
        ["classify", run, "--input", LABELLED / "good.jsonl"],
        ["evaluate", run, "--data", LABELLED / "good.jsonl"],
        ["train", "--resume", run],
    ):
        code, err = qkv(capsys, *command)
        assert_fails(code, err, run / "config.json")


# --------------------------------------------------------------------------- real processes


def test_real_processes_print_one_line_and_no_traceback(
    translation_run: Path, tmp_path: Path
) -> None:
    mismatch = TRANSLATION / "mismatch"
    train = ["train", "translation", "--data", mismatch, "--out", tmp_path / "run"]
    translate = ["translate", translation_run, "--input", TEXT / "bad_utf8.de"]
    commands = {mismatch / "train.de": train, TEXT / "bad_utf8.de": translate}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    started = {
        at_fault: subprocess.Popen(
            [str(QKV), *map(str, argv)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for at_fault, argv in commands.items()
    }
    for at_fault, proc in started.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 2, err
        assert "Traceback" not in err + out
        assert_one_line(err, at_fault)


def test_closed_streams_are_named_and_a_closed_pipe_stops_training_cleanly(
    translation_run: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    good = TRANSLATION / "good"
    train = f"{QKV} train translation --data {good} --out {run} --preset tiny vocab_size=100"
    train += " max_tokens=256 max_steps=400 eval_every=100 log_every=1"
    scripts = {  # bash: what it runs, and the line expected on stderr
        f"{train} | head -n 1; exit ${{PIPESTATUS[0]}}": (130, "qkv: stdout closed: checkpoint"),
        f"{QKV} translate {translation_run} <&-": (2, "qkv: <stdin>: closed; give the input"),
        f"{QKV} translate {translation_run} --input {TEXT / 'src.de'} >&-": (
            2,
            "qkv: <stdout>: closed; give a file with --output FILE",
        ),
    }
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    started = {
        script: subprocess.Popen(
            ["bash", "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for script in scripts
    }
    for script, proc in started.items():
        _, err = proc.communicate(timeout=600)
        code, message = scripts[script]
        assert proc.returncode == code and "Traceback" not in err, err
        assert err.splitlines()[-1].startswith(message), err
    assert len(list((run / "checkpoints").iterdir())) == 1  # stopped early, its step saved
    assert cli("train", "--resume", run, "max_steps=2") == 0


def test_messages_name_what_is_wrong(
    capsys: pytest.CaptureFixture[str], translation_run: Path, tmp_path: Path
) -> None:
    code, err = qkv(capsys, "train", "foo", "--data", TRANSLATION / "good", "--out", tmp_path / "r")
    assert code == 2 and err == "qkv: unknown task 'foo': train translation or classification\n"
    weights = translation_run / "model.safetensors"
    code, err = qkv(capsys, "translate", weights, "--input", TEXT / "src.de")
    assert code == 2 and err == f"qkv: {weights}: a file, not a run directory\n"
    with pytest.raises(SystemExit):
        qkv(capsys, "train", "translation", "--out", tmp_path / "r", "max_steps=3", "lr")
    assert "unrecognized arguments: lr\n" in capsys.readouterr().err
