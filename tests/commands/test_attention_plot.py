"""`qkv attention` and `qkv plot` on a trained translation run and a small classification run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from qkv.cli import main
from qkv.commands.attention import (
    CROSS,
    DECODER_SELF,
    ENCODER_SELF,
    draw_attention,
    parse_indices,
    parse_kinds,
    sentence_attention,
)
from qkv.commands.plot import draw_curves
from qkv.data.tokenizer import Tokenizer
from qkv.errors import ConfigError, QkvError
from qkv.model.classifier import TextClassifier
from qkv.model.config import ModelConfig
from qkv.run import TOKENIZER_FILE, WEIGHTS_FILE, RunConfig
from qkv.training.checkpoint import save_weights
from qkv.training.config import TrainConfig
from qkv.viz.attention import select_panels
from tests.commands.test_demo import readable_png, shortened_demo

SENTENCE = "Wed 3 Mar 2021"


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shortened_demo(tmp_path_factory).paths["run"]


@pytest.fixture(scope="session")
def classifier_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained two-label classifier saved as a run, with a [CLS] token."""
    run = tmp_path_factory.mktemp("classifier")
    texts = ["a good film", "a bad film", "good acting", "bad plot", "the film was good"] * 4
    tokenizer = Tokenizer.train(texts, vocab_size=60, min_frequency=1)
    tokenizer.save(run / TOKENIZER_FILE)
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_encoder_layers=2,
        n_decoder_layers=0,
        max_len=6,
        n_classes=2,
        pooling="cls",
    )
    data = {"labels": ["negative", "positive"], "cls": True, "max_len": 6}
    RunConfig("classification", config, TrainConfig(), data).save(run)
    save_weights(TextClassifier(config), run / WEIGHTS_FILE)
    return run


def test_maps_have_one_row_and_column_per_token(run_dir: Path) -> None:
    attention = sentence_attention(run_dir, SENTENCE)
    source = attention.key_tokens[ENCODER_SELF]
    target = attention.query_tokens[CROSS]
    assert target[0] == "<s>"
    assert attention.query_tokens[DECODER_SELF] == attention.key_tokens[DECODER_SELF] == target
    assert attention.key_tokens[CROSS] == source
    assert attention.title.startswith(f"{SENTENCE} → ")
    shapes = {ENCODER_SELF: (len(source),) * 2, DECODER_SELF: (len(target),) * 2}
    shapes[CROSS] = (len(target), len(source))
    for kind, (n_queries, n_keys) in shapes.items():
        assert len(attention.maps[kind]) == 2  # layers
        for weights_HQK in attention.maps[kind]:
            assert weights_HQK.shape == (4, n_queries, n_keys)
            assert torch.allclose(weights_HQK.sum(-1), torch.ones(4, n_queries), atol=1e-5)


def test_layers_and_heads_choose_the_panels(run_dir: Path) -> None:
    attention = sentence_attention(run_dir, SENTENCE)
    tokens = (attention.query_tokens, attention.key_tokens)
    assert len(select_panels(attention.maps, *tokens)) == 3 * 2 * 4
    chosen = select_panels(attention.maps, *tokens, layers=[1], heads=[0, 2])
    assert [panel.title for panel in chosen] == [
        f"{kind} · layer 1 · head {head}"
        for kind in (ENCODER_SELF, DECODER_SELF, CROSS)
        for head in (0, 2)
    ]


def test_draw_attention_writes_a_picture_per_choice(run_dir: Path, tmp_path: Path) -> None:
    six = draw_attention(run_dir, SENTENCE, tmp_path / "six.png", layers=[1], heads=[0, 1])
    one = draw_attention(run_dir, SENTENCE, tmp_path / "one.png", [CROSS], [0], [1])
    assert six == tmp_path / "six.png"
    six_height, six_width = readable_png(six).shape[:2]
    one_height, one_width = readable_png(one).shape[:2]
    assert six_height > one_height and six_width > one_width


def test_cli_attention(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "maps.png"
    argv = ["attention", str(run_dir), SENTENCE, "--out", str(out)]
    assert main([*argv, "--kinds", "cross,encoder-self", "--layers", "1", "--heads", "0,2"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    readable_png(out)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--layers", "2"], "layer 2 is out of range"),
        (["--heads", "0,9"], "head 9 is out of range"),
        (["--layers", "first"], "--layers takes comma-separated 0-based numbers"),
        (["--heads", "-1"], "cannot be negative"),
        (["--kinds", "cross,diagonal"], "unknown attention kind 'diagonal'"),
    ],
)
def test_cli_attention_errors_are_one_line(
    run_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    options: list[str],
    message: str,
) -> None:
    out = tmp_path / "maps.png"
    assert main(["attention", str(run_dir), SENTENCE, "--out", str(out), *options]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("qkv: ")
    assert message in error
    assert not out.exists()


def test_empty_sentence_and_missing_run_are_errors(run_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="empty"):
        draw_attention(run_dir, "  ", tmp_path / "x.png")
    with pytest.raises(QkvError, match="not found"):
        draw_attention(tmp_path / "nowhere", SENTENCE, tmp_path / "x.png")


def test_parse_indices_and_kinds() -> None:
    assert parse_indices(None, "--layers") is None
    assert parse_indices(" ", "--layers") is None
    assert parse_indices("0, 2,1", "--layers") == [0, 2, 1]
    assert parse_kinds("Cross, encoder_self, cross") == [CROSS, ENCODER_SELF]
    assert parse_kinds(None) is None
    with pytest.raises(ConfigError, match=r"1\.5"):
        parse_indices("1.5", "--heads")


def test_classifier_attention_has_encoder_maps_and_the_label(
    classifier_run: Path, tmp_path: Path
) -> None:
    attention = sentence_attention(classifier_run, "a good film with a bad plot and good acting")
    assert list(attention.maps) == [ENCODER_SELF]
    tokens = attention.query_tokens[ENCODER_SELF]
    assert tokens[0] == "<cls>"
    assert len(tokens) == 6  # truncated to max_len
    assert attention.maps[ENCODER_SELF][0].shape == (2, 6, 6)
    assert attention.title.startswith(("predicted: negative", "predicted: positive"))
    out = draw_attention(classifier_run, "a good film", tmp_path / "cls.png")
    readable_png(out)
    with pytest.raises(ConfigError, match="no cross attention"):
        draw_attention(classifier_run, "a good film", tmp_path / "cross.png", kinds=[CROSS])


def test_classifier_attention_sees_what_classify_sees(classifier_run: Path) -> None:
    from qkv.inference.classifier import Classifier

    text = "a good<br /><br />film with a bad plot and good acting, the film was good"
    label, probability = Classifier.load(classifier_run, device="cpu").predict([text])[0]
    attention = sentence_attention(classifier_run, text)
    assert attention.title == f"predicted: {label} ({probability:.0%})"
    assert "<br" not in "".join(attention.query_tokens[ENCODER_SELF])  # cleaned as for training
    with pytest.raises(ConfigError, match="no tokens"):
        sentence_attention(classifier_run, "<br /><br />")


def test_pictures_take_their_format_from_the_suffix(run_dir: Path, tmp_path: Path) -> None:
    assert draw_curves(run_dir, tmp_path / "curves.svg").read_text().lstrip().startswith("<?xml")
    assert (draw_curves(run_dir, tmp_path / "curves.pdf")).read_bytes().startswith(b"%PDF")
    with pytest.raises(ConfigError, match=r"'\.xyz'"):
        draw_curves(run_dir, tmp_path / "curves.xyz")
    assert not list(tmp_path.glob("*.xyz"))


def test_cli_picture_to_a_directory_is_one_line(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plot", str(run_dir), "--out", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"qkv: {tmp_path}: is a directory; give a file name such as maps.png"
    )
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["plot", str(run_dir), "--out", str(blocker / "curves.png")]) == 2
    assert capsys.readouterr().err == (
        f"qkv: {blocker / 'curves.png'}: cannot write: {blocker} is a file, not a directory\n"
    )
    assert main(["plot", str(run_dir), "--out", str(blocker / "deeper" / "curves.png")]) == 2
    assert f": {blocker} is a file, not a directory" in capsys.readouterr().err
    assert blocker.read_text() == "x"


def test_cli_plot(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "curves.png"
    assert main(["plot", str(run_dir), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    readable_png(out)


def test_plot_defaults_to_the_run_directory(run_dir: Path) -> None:
    assert draw_curves(run_dir) == run_dir / "curves.png"
    readable_png(run_dir / "curves.png")


def test_cli_plot_without_metrics_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plot", str(tmp_path)]) == 2
    assert "metrics" in capsys.readouterr().err
