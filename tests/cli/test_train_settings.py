"""What `qkv train` accepts: settings out of range, settings and flags of the other task or of
no task, settings on `--resume`, and the directory a new run is made in."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from qkv.cli import main
from qkv.data.cache import open_token_cache

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
TRANSLATION, LABELLED = CORPUS / "translation" / "good", CORPUS / "labelled" / "good.jsonl"
TINY = ["--preset", "tiny", "vocab_size=100", "max_tokens=256", "max_steps=2", "eval_every=2"]

pytestmark = pytest.mark.usefixtures("one_thread")


def qkv(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


def translation(out: Path, *extra: str) -> list[str | Path]:
    return ["train", "translation", "--data", TRANSLATION, "--out", out, *TINY, *extra]


def classification(out: Path, *extra: str) -> list[str | Path]:
    tiny = ["--preset", "tiny", "vocab_size=60", "max_steps=2", "eval_every=2"]
    return ["train", "classification", "--train", LABELLED, "--out", out, *tiny, *extra]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    assert main([str(a) for a in translation(out)]) == 0
    return out


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("vocab_size=-5", "vocab_size must be more than the 5 special tokens"),
        ("min_frequency=-1", "min_frequency must be 0 or more"),
        ("seed=99999999999999999999", "seed must be between 0 and 2**63 - 1"),
        ("threads=100000", "threads must be 0 (torch's default) or more, up to 1024"),
        ("lr=inf", "lr must be a positive number"),
        ("weight_decay=inf", "weight_decay must be a number"),
        ("n_classes=3", "n_classes does not apply to translation"),
        ("max_len=100000000", "max_len must be between 1 and 65536"),
        ("n_decoder_layers=0", "translation needs a decoder: n_decoder_layers must be 1 or more"),
        ("tgt_vocab_size=100", "translation shares one vocabulary"),
        ("data_dir=elsewhere", "--data and data_dir= both say the same thing"),
    ],
)
def test_translation_settings_out_of_place(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, setting: str, message: str
) -> None:
    code, err = qkv(capsys, *translation(tmp_path / "r", setting))
    assert code == 2 and err.startswith(f"qkv: {message}"), err
    assert err.count("\n") == 1 and not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("max_len=0", "max_len must be at least 1"),
        ("pooling=cls max_len=1", "max_len must be at least 2 with a [CLS] token"),
        ("n_decoder_layers=2", "n_decoder_layers does not apply to classification"),
        ("cls=true", "cls follows the pooling"),
        ("labels=neg,pos,pos", "labels= names a label twice"),
        ("n_classes=5", "n_classes follows the data's labels"),
        ("valid_file=v.jsonl valid_fraction=0.2", "--valid-fraction holds out part of --train"),
        ("--valid v.jsonl --valid-fraction 0.2", "--valid-fraction holds out part of --train"),
        ("train_file=other.jsonl", "--train and train_file= both say the same thing"),
        ("split_seed=-1", "split_seed must be between 0 and 2**63 - 1"),
    ],
)
def test_classification_settings_out_of_place(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, setting: str, message: str
) -> None:
    code, err = qkv(capsys, *classification(tmp_path / "r", *setting.split()))
    assert code == 2 and err.startswith(f"qkv: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "r").exists()


def test_a_run_older_than_split_seed_keeps_its_held_out_share_when_resumed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The share is drawn again when the cache is gone: by the seed config.json holds, not
    by a new `seed=`, and that seed is saved."""
    out = tmp_path / "r"
    assert qkv(capsys, *classification(out, "--valid-fraction", "0.25", "seed=1"))[0] == 0
    config = json.loads((out / "config.json").read_text())
    del config["data"]["split_seed"]  # as a run made before it was kept
    (out / "config.json").write_text(json.dumps(config))
    cache = out / "cache" / "tokens.safetensors"
    before = open_token_cache(cache)
    assert before is not None
    held_out = [list(row) for row in before.arrays["valid.ids"]]
    cache.unlink()
    with pytest.warns(UserWarning, match="is gone"):
        code, err = qkv(capsys, "train", "--resume", out, "seed=3", "max_steps=4")
    assert code == 0, err
    after = open_token_cache(cache)
    assert after is not None and [list(row) for row in after.arrays["valid.ids"]] == held_out
    assert json.loads((out / "config.json").read_text())["data"]["split_seed"] == 1


def test_the_data_may_be_named_by_its_setting_alone(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`train_file=` and `data_dir=` stand for `--train` and `--data`, as `valid_file=` does
    for `--valid`."""
    tiny = ["--preset", "tiny", "vocab_size=60", "max_steps=2", "eval_every=2"]
    argv = ["train", "classification", f"train_file={LABELLED}", "--out", tmp_path / "c", *tiny]
    code, err = qkv(capsys, *argv)
    assert code == 0, err
    code, err = qkv(
        capsys, "train", "translation", f"data_dir={TRANSLATION}", "--out", tmp_path / "t", *TINY
    )
    assert code == 0, err
    for task, flag in (("classification", "--train FILE"), ("translation", "--data DIR")):
        code, err = qkv(capsys, "train", task, "--out", tmp_path / "none", *TINY)
        assert code == 2 and err == f"qkv: train {task} needs {flag}\n"


def test_a_run_with_no_preset_reads_its_training_file_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The size that fits the settings to the data is counted on the texts training reads."""
    import qkv.tasks.classification as classification

    reads: list[Path] = []

    def counted(path: Path, **kwargs: Any) -> tuple[list[str], list[str]]:
        reads.append(path)
        return read_labelled(path, **kwargs)

    read_labelled = classification.read_labelled
    monkeypatch.setattr(classification, "read_labelled", counted)
    small = ["vocab_size=60", "max_steps=2", "eval_every=2", "d_model=16", "d_ff=32"]
    argv = ["train", "classification", "--train", LABELLED, "--out", tmp_path / "r", *small]
    code, err = qkv(capsys, *argv)
    assert code == 0, err
    assert reads == [LABELLED]


def test_a_file_with_other_common_field_names_trains_without_flags(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """GLUE's SST-2 files name the text `sentence`: a new run finds it and says so."""
    rows = [json.loads(line) for line in LABELLED.read_text().splitlines() if line.strip()]
    sst = tmp_path / "train.tsv"
    sst.write_text("sentence\tlabel\n" + "".join(f"{r['text']}\t{r['label']}\n" for r in rows))
    tiny = ["--preset", "tiny", "vocab_size=60", "max_steps=2", "eval_every=2"]
    capsys.readouterr()
    assert (
        main(["train", "classification", "--train", str(sst), "--out", str(tmp_path / "r"), *tiny])
        == 0
    )
    assert "reading texts from 'sentence'" in capsys.readouterr().out
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["data"]["text_field"] == "sentence"


def test_a_given_validation_share_is_the_one_held_out(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, err = qkv(capsys, *classification(tmp_path / "r", "--valid-fraction", "0.5"))
    assert code == 0, err
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["data"]["valid_fraction"] == 0.5


def test_labels_are_a_list_that_must_name_every_label(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, err = qkv(capsys, *classification(tmp_path / "a", "labels=pos,meh"))
    assert code == 2 and "has labels that labels= does not name: neg" in err, err
    code, err = qkv(capsys, *classification(tmp_path / "b", "labels=pos,neg"))
    assert code == 0, err
    config = json.loads((tmp_path / "b" / "config.json").read_text())
    assert config["data"]["labels"] == ["pos", "neg"] and config["model"]["n_classes"] == 2


@pytest.mark.parametrize(
    ("task", "flag"),
    [("translation", ["--train", str(LABELLED)]), ("classification", ["--data", str(TRANSLATION)])],
)
def test_flags_of_the_other_task_are_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, task: str, flag: list[str]
) -> None:
    make = translation if task == "translation" else classification
    code, err = qkv(capsys, *make(tmp_path / "r"), *flag)
    other = "classification" if task == "translation" else "translation"
    assert code == 2 and err == f"qkv: {flag[0]} is for {other}, not {task}\n", err


@pytest.mark.parametrize(
    "extra",
    [["--out", "elsewhere"], ["--preset", "big"], ["translation"], ["--data", "new"]],
    ids=str,
)
def test_resume_refuses_what_belongs_to_a_new_run(
    capsys: pytest.CaptureFixture[str], run: Path, extra: list[str]
) -> None:
    code, err = qkv(capsys, "train", "--resume", run, *extra)
    given = "task" if extra == ["translation"] else extra[0]
    assert code == 2 and f"so {given} does not apply" in err, err


def test_an_empty_out_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = qkv(capsys, "train", "translation", "--data", TRANSLATION, "--out", " ")
    assert code == 2 and err == "qkv: --out is empty; name the directory of the run\n", err


def test_resume_names_an_unknown_setting_as_unknown(
    capsys: pytest.CaptureFixture[str], run: Path
) -> None:
    code, err = qkv(capsys, "train", "--resume", run, "max_step=50", "zzz=1")
    assert code == 2, err
    assert err == "qkv: unknown setting(s): max_step (did you mean max_steps?), zzz\n", err
    code, err = qkv(capsys, "train", "--resume", run, "d_model=8")
    assert code == 2 and "only training settings and the data's places can change" in err
    code, err = qkv(capsys, "train", "--resume", run, "lr")
    assert code == 2 and err == "qkv: expected key=value, got 'lr'\n", err


def test_a_new_run_is_not_made_among_other_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    code, err = qkv(capsys, *translation(mine))
    assert code == 2 and "holds files and no run (notes.txt)" in err, err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]  # not even a lock file left


def test_out_must_not_be_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("mine\n")
    code, err = qkv(capsys, *translation(tmp_path / "afile"))
    assert (
        code == 2
        and err == f"qkv: {tmp_path / 'afile'} is a file; --out names a directory for the run\n"
    )


def test_a_run_that_fails_in_an_empty_directory_leaves_it_empty(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, err = qkv(capsys, *translation(empty, "max_len=1"))
    assert code == 2 and "no training pair is left" in err, err
    assert list(empty.iterdir()) == []
    code, err = qkv(capsys, *translation(empty))  # and the next try may use it
    assert code == 0, err


def test_the_models_positions_cover_the_datas_max_len(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, err = qkv(capsys, *translation(tmp_path / "r", "max_len=3000"))
    assert code == 0, err
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["data"]["max_len"] == 3000 and config["model"]["max_len"] == 3000


def test_a_run_before_its_first_weights_says_how_to_go_on(
    capsys: pytest.CaptureFixture[str], run: Path, tmp_path: Path
) -> None:
    early = tmp_path / "early"
    shutil.copytree(run, early)
    (early / "model.safetensors").unlink()
    shutil.rmtree(early / "checkpoints")
    code, err = qkv(capsys, "translate", early, "--input", CORPUS / "text" / "src.de")
    assert code == 2 and "not written yet" in err and f"--resume {early}" in err, err
