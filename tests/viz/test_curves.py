"""Training curves: reading the metrics log and plotting it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matplotlib import image as mpimg
from matplotlib.figure import Figure

from qkv.errors import DataError
from qkv.viz import curves
from qkv.viz.curves import plot_curves, read_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def synthetic_log(metric: str, with_train_metric: bool = False) -> list[dict[str, object]]:
    records: list[dict[str, object]] = []
    for step in range(50, 1001, 50):
        train: dict[str, object] = {
            "split": "train",
            "step": step,
            "epoch": step // 500 + 1,
            "loss": 5.0 / (1 + step / 200),
            "lr": 0.0007 * min(step / 400, (400 / step) ** 0.5),
            "tokens_per_s": 2100.0,
        }
        if with_train_metric:
            train[metric] = min(1.0, step / 900)
        records.append(train)
        if step % 200 == 0:
            records.append(
                {
                    "split": "valid",
                    "step": step,
                    "epoch": step // 500 + 1,
                    "loss": 5.5 / (1 + step / 250),
                    metric: step / 1100 if metric == "accuracy" else step / 30,
                }
            )
    return records


def write_log(path: Path, records: list[dict[str, object]], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail, encoding="utf-8")
    return path


def assert_readable_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC
    assert mpimg.imread(path).std() > 0


def test_read_metrics_returns_records_in_order(tmp_path: Path) -> None:
    records = synthetic_log("bleu")
    assert read_metrics(write_log(tmp_path / "metrics.jsonl", records)) == records


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    records = synthetic_log("bleu")
    path = write_log(tmp_path / "metrics.jsonl", records, tail='{"split": "train", "st')
    assert read_metrics(path) == records


def test_blank_lines_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"split": "train", "step": 1, "loss": 2.0}\n\n', encoding="utf-8")
    assert read_metrics(path) == [{"split": "train", "step": 1, "loss": 2.0}]


def test_malformed_middle_line_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"split": "train", "step": 1, "loss": 2.0}\n'
        '{"split": "train", "step": 2, "loss": \n'
        '{"split": "train", "step": 3, "loss": 1.5}\n',
        encoding="utf-8",
    )
    with pytest.raises(DataError) as caught:
        read_metrics(path)
    assert caught.value.line == 2
    assert "metrics.jsonl:2" in str(caught.value)


def test_a_line_that_is_not_an_object_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('[1, 2]\n{"split": "train", "step": 1, "loss": 2.0}\n', encoding="utf-8")
    with pytest.raises(DataError, match="JSON object"):
        read_metrics(path)


def test_missing_file_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"no metrics log here \(not a run directory\?\)"):
        read_metrics(tmp_path / "metrics.jsonl")


def test_non_utf8_log_is_a_data_error(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_bytes(b'{"step": 1}\n\xff\n')
    with pytest.raises(DataError, match="not UTF-8"):
        read_metrics(tmp_path / "metrics.jsonl")


@pytest.mark.parametrize("content", ["", "\n\n", '{"split": "train", "st'])
def test_no_records_is_a_data_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match="no train or valid records"):
        plot_curves(path, tmp_path / "curves.png")


def test_translation_curves_with_bleu_and_chrf(tmp_path: Path) -> None:
    records = synthetic_log("bleu")
    for record in records:
        if record["split"] == "valid":
            record["chrf"] = 50.0
    (tmp_path / "run").mkdir()
    log = write_log(tmp_path / "run" / "metrics.jsonl", records)
    out = plot_curves(log, tmp_path / "plots" / "curves.png")
    assert out == tmp_path / "plots" / "curves.png"
    assert_readable_png(out)
    assert [p.name for p in out.parent.iterdir()] == ["curves.png"]


def test_classification_curves_with_train_and_valid_accuracy(tmp_path: Path) -> None:
    log = write_log(tmp_path / "metrics.jsonl", synthetic_log("accuracy", with_train_metric=True))
    out = plot_curves(log, tmp_path / "curves.png")
    assert_readable_png(out)


def test_more_metrics_make_a_bigger_figure(tmp_path: Path) -> None:
    only_train = [r for r in synthetic_log("bleu") if r["split"] == "train"]
    small = plot_curves(write_log(tmp_path / "a.jsonl", only_train), tmp_path / "a.png")
    large = plot_curves(write_log(tmp_path / "b.jsonl", synthetic_log("bleu")), tmp_path / "b.png")
    assert mpimg.imread(large).shape[0] > mpimg.imread(small).shape[0]


def drawn_figure(monkeypatch: pytest.MonkeyPatch, log: Path, out: Path) -> Figure:
    """Plot `log` and return the figure instead of only its file."""
    drawn: list[Figure] = []

    def keep(figure: Figure, path: str | Path) -> Path:
        drawn.append(figure)
        return Path(path)

    monkeypatch.setattr(curves, "save_figure", keep)
    plot_curves(log, out)
    return drawn[0]


def test_the_checkpoint_average_is_a_star_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = synthetic_log("bleu")
    records.append({"split": "valid", "step": 1000, "averaged": 3, "loss": 0.5, "bleu": 1.0})
    figure = drawn_figure(monkeypatch, write_log(tmp_path / "m.jsonl", records), tmp_path / "c.png")
    bleu = next(ax for ax in figure.axes if ax.get_title() == "BLEU")
    lines = {line.get_label(): line for line in bleu.get_lines()}
    assert list(lines["valid bleu"].get_ydata()) == [
        step / 30 for step in (200, 400, 600, 800, 1000)
    ]
    assert list(lines["checkpoint average"].get_ydata()) == [1.0]
    assert lines["checkpoint average"].get_marker() == "*"


def test_a_series_of_one_point_is_drawn_as_a_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = [{"split": "train", "step": 10, "loss": 2.0, "lr": 1e-4}]
    figure = drawn_figure(monkeypatch, write_log(tmp_path / "m.jsonl", records), tmp_path / "c.png")
    for ax in figure.axes[:2]:  # loss and learning rate
        (line,) = ax.get_lines()
        assert line.get_marker() == "o"


def test_a_run_without_metrics_yet_says_so(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(DataError, match="no metrics yet"):
        read_metrics(tmp_path / "metrics.jsonl")


def test_a_run_named_with_dollars_is_titled_as_it_is(tmp_path: Path) -> None:
    run = tmp_path / r"r$\bad$"  # TeX to matplotlib, unless told otherwise: a parse error
    run.mkdir()
    path = write_log(run / "metrics.jsonl", synthetic_log("bleu"))
    assert_readable_png(plot_curves(path, tmp_path / "curves.png"))
