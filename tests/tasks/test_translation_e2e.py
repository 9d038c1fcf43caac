"""A tiny translation run end to end: train -> save -> load -> translate -> evaluate."""

from __future__ import annotations

import io
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from qkv.cli import main
from qkv.inference.translator import Translator
from qkv.tasks.dates import generate_date_pairs
from tests.tasks.helpers import write_dates


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("translation")
    data = write_dates(root / "data", train=400, val=30)
    run = root / "run"
    code = main(
        [
            "train",
            "translation",
            "--data",
            str(data),
            "--src",
            "src",
            "--tgt",
            "tgt",
            "--out",
            str(run),
            "--preset",
            "tiny",
            "vocab_size=120",
            "max_steps=40",
            "eval_every=20",
            "average_last=2",
            "threads=2",
        ]
    )
    assert code == 0
    return run


def test_run_directory_holds_everything(tiny_run: Path) -> None:
    for name in ("config.json", "tokenizer.json", "model.safetensors", "metrics.jsonl"):
        assert (tiny_run / name).is_file(), name
    records = [json.loads(x) for x in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in records if r["split"] == "valid"]
    assert {"loss", "bleu", "chrf", "bleu_lowercase"} <= set(valid[0])
    assert any(r.get("averaged") == 2 for r in valid)
    assert not list((tiny_run / "checkpoints").glob("*.tmp"))


def test_translator_round_trip(tiny_run: Path) -> None:
    translator = Translator.load(tiny_run)
    sentences = [s for s, _ in generate_date_pairs(5, seed=3)]
    greedy = translator.translate(sentences, beam_size=1)
    beam = translator.translate(sentences, beam_size=4)
    assert len(greedy) == len(beam) == 5
    assert all(isinstance(x, str) for x in greedy + beam)
    assert translator.translate(["", "   ", "\t"], beam_size=1) == ["", "", ""]
    with pytest.raises(TypeError, match="a list of strings, not one string"):
        translator.translate("March 3, 2021", beam_size=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be strings, got NoneType"):
        translator.translate(["March 3, 2021", None], beam_size=1)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="a list of strings, not NoneType"):
        translator.translate(None, beam_size=1)  # type: ignore[arg-type]


def test_translate_keeps_every_stdin_line_in_its_place(
    tiny_run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Lines split on "\\n" only, as files are: a U+2028 inside a sentence keeps it one line."""
    text = "July 4,\u2028 1976\n\n   \nMarch 3, 2021\r\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode("utf-8"))))
    assert main(["translate", str(tiny_run), "--beam", "1"]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert len(lines) == 5 and lines[-1] == ""  # four lines in, four out
    expected = Translator.load(tiny_run).translate(["July 4,\u2028 1976", "March 3, 2021"], 1)
    assert lines[:4] == [expected[0], "", "", expected[1]]


def test_dash_is_stdin_and_stdout_and_json_records_stay_one_line_each(
    tiny_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = "July 4,\u2028 1976\nMarch 3,\x85 2021\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode("utf-8"))))
    args = ["translate", str(tiny_run), "--beam", "1", "--json"]
    assert main([*args, "--input", "-", "--output", "-"]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 2  # as str.splitlines reads them: no line break inside
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["source"] for r in records] == ["July 4,\u2028 1976", "March 3,\x85 2021"]
    assert not (tmp_path / "-").exists() and not Path("-").exists()


def test_an_output_that_is_the_input_is_refused(
    tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "same.src"
    source.write_text("March 3, 2021\n", encoding="utf-8")
    link = tmp_path / "link.src"
    link.symlink_to(source)
    for output in (source, link):
        args = ["translate", str(tiny_run), "--input", str(source), "--output", str(output)]
        assert main(args) == 2
        assert f"qkv: {output}: is the input file, which the output would replace\n" == (
            capsys.readouterr().err
        )
    assert source.read_text(encoding="utf-8") == "March 3, 2021\n"


def test_translate_and_evaluate_commands(
    tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pairs = generate_date_pairs(10, seed=4)
    src, ref = tmp_path / "test.src", tmp_path / "test.ref"
    src.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    ref.write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    out = tmp_path / "out.txt"
    assert (
        main(["translate", str(tiny_run), "--input", str(src), "--output", str(out), "--beam", "2"])
        == 0
    )
    assert len(out.read_text(encoding="utf-8").splitlines()) == 10
    eager = tmp_path / "eager.txt"
    options = ["--input", str(src), "--output", str(eager), "--beam", "2", "--no-cuda-graphs"]
    assert main(["translate", str(tiny_run), *options]) == 0
    assert eager.read_text(encoding="utf-8") == out.read_text(encoding="utf-8")
    assert (
        main(
            [
                "evaluate",
                str(tiny_run),
                "--src",
                str(src),
                "--ref",
                str(ref),
                "--json",
                "--beam",
                "1",
            ]
        )
        == 0
    )
    scores = json.loads(capsys.readouterr().out)
    assert 0.0 <= scores["bleu"] <= 100.0
    assert scores["bleu_signature"].startswith("nrefs:1")
    assert scores["sentences"] == 10


def test_translate_output_replaces_a_file_whole_and_writes_devices_in_place(
    tiny_run: Path, tmp_path: Path
) -> None:
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("July 4, 1976\nMarch 3, 2021\n", encoding="utf-8")
    out.write_text("an older translation\n" * 5, encoding="utf-8")
    assert main(["translate", str(tiny_run), "--input", str(src), "--output", str(out)]) == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]  # no temporary
    assert main(["translate", str(tiny_run), "--input", str(src), "--output", os.devnull]) == 0
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)  # still the device, not a file put there


def test_resume_can_extend_training_settings(
    tiny_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "--resume", str(tiny_run), "d_model=8"]) == 2
    assert "only training settings and the data's places can change" in capsys.readouterr().err
    assert main(["train", "--resume", str(tiny_run), "max_steps=45", "eval_every=5"]) == 0
    config = json.loads((tiny_run / "config.json").read_text())
    assert config["train"]["max_steps"] == 45
    assert (tiny_run / "checkpoints" / "step-0000045").is_dir()
