"""Training curves from a run's `metrics.jsonl`: loss, learning rate and validation metrics.

The log holds one JSON object per line, e.g. `{"split": "train", "step": 100, "epoch": 1,
"loss": 3.2, "lr": 0.0005}` or `{"split": "valid", "step": 100, "loss": 2.9, "bleu": 30.1}`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from qkv.errors import DataError
from qkv.fits import fits
from qkv.viz.attention import DPI, save_figure

# Bookkeeping fields, not metrics worth a panel.
_NOT_METRICS = {
    "split",
    "step",
    "epoch",
    "loss",
    "lr",
    "tokens_per_s",
    "targets_per_s",
    "elapsed_s",
    "averaged",
}
_DISPLAY_NAMES = {"loss": "Loss", "bleu": "BLEU", "chrf": "chrF", "accuracy": "Accuracy"}


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics log, one JSON object per line, in file order. A torn last line
    (a run killed mid-write) and blank lines are skipped; a malformed line elsewhere is a
    DataError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if (path.parent / "config.json").is_file():
            raise DataError(path, "no metrics yet: the run has not logged a step") from None
        raise DataError(path, "no metrics log here (not a run directory?)") from None
    except OSError as error:
        raise DataError(path, f"cannot read the metrics log ({error.strerror})") from None
    except UnicodeDecodeError:
        raise DataError(path, "the metrics log is not UTF-8 text") from None
    lines = text.splitlines()
    records = []
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if line_number == len(lines):
                break  # torn by an interrupted write
            raise DataError(path, f"not valid JSON: {error.msg}", line_number) from error
        if not isinstance(record, dict):
            raise DataError(path, "expected a JSON object", line_number)
        records.append(record)
    return records


def plot_curves(metrics_path: str | Path, out_path: str | Path) -> Path:
    """Plots a run's training curves to a picture (see `viz.attention.save_figure`); returns
    its path. Panels, against step: train and valid loss; the learning rate; one per metric
    of the valid records (BLEU, chrF, accuracy, ...), with its train values where they exist.
    The final checkpoint average's score is a separate star, not a point of the valid line."""
    records = read_metrics(metrics_path)
    train = [r for r in records if r.get("split") == "train"]
    valid_records = [r for r in records if r.get("split") == "valid"]
    valid = [r for r in valid_records if "averaged" not in r]
    averaged = [r for r in valid_records if "averaged" in r]  # the checkpoint average, at the end
    if not any(fits(r.get("step"), float) for r in train + valid):
        raise DataError(metrics_path, "no train or valid records with a step to plot")

    panels = ["loss"]
    if _series(train, "lr")[0]:
        panels.append("lr")
    panels += _valid_metrics(valid_records)

    with matplotlib.rc_context({"text.parse_math": False}):  # a "$" in a run's name is a "$"
        return _plotted(panels, train, valid, averaged, Path(metrics_path), out_path)


def _plotted(
    panels: list[str],
    train: list[dict[str, Any]],
    valid: list[dict[str, Any]],
    averaged: list[dict[str, Any]],
    metrics_path: Path,
    out_path: str | Path,
) -> Path:
    n_columns = min(2, len(panels))
    n_rows = math.ceil(len(panels) / n_columns)
    figure = Figure(figsize=(5.5 * n_columns, 3.8 * n_rows), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = list(figure.subplots(n_rows, n_columns, squeeze=False).flat)
    for ax in axes[len(panels) :]:
        ax.set_axis_off()
    for ax, metric in zip(axes, panels, strict=False):
        if metric == "lr":
            _draw(ax, train, "lr", label=None, style="-")
            _decorate(ax, "Learning rate", "learning rate")
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        else:
            name = _DISPLAY_NAMES.get(metric, metric)
            _draw(ax, train, metric, label=f"train {name.lower()}", style="-")
            _draw(ax, valid, metric, label=f"valid {name.lower()}", style="o-")
            _draw(ax, averaged, metric, label="checkpoint average", style="*")
            _decorate(ax, name, name.lower())
    figure.suptitle(metrics_path.parent.name or "training curves")
    return save_figure(figure, out_path)


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of the records with both a numeric step and a numeric `key`."""
    points = [
        (float(r["step"]), float(r[key]))
        for r in records
        if fits(r.get("step"), float) and fits(r.get(key), float)
    ]
    return [step for step, _ in points], [value for _, value in points]


def _valid_metrics(valid: list[dict[str, Any]]) -> list[str]:
    """Names of the numeric metrics of valid records, loss excluded, in first-seen order."""
    names: dict[str, None] = {}
    for record in valid:
        for key, value in record.items():
            if key not in _NOT_METRICS and fits(value, float):
                names[key] = None
    return list(names)


def _draw(ax: Axes, records: list[dict[str, Any]], key: str, label: str | None, style: str) -> None:
    steps, values = _series(records, key)
    if steps:
        if len(steps) == 1 and style == "-":  # a line of one point shows nothing
            style = "o-"
        ax.plot(steps, values, style, label=label, markersize=9 if style == "*" else 3)


def _decorate(ax: Axes, title: str, y_label: str) -> None:
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(y_label)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()


def write_curves(run_dir: Path) -> Path | None:
    """Draws RUN/curves.png from RUN/metrics.jsonl and returns its path; None without a log."""
    metrics = Path(run_dir) / "metrics.jsonl"
    if not metrics.is_file():
        return None
    return plot_curves(metrics, Path(run_dir) / "curves.png")
