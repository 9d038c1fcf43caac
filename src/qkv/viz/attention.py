"""Attention heatmaps: one panel per (kind, layer, head), tokens on both axes.

Figures use `matplotlib.figure.Figure` on the Agg canvas, never pyplot, so plotting touches
no global state and needs no display. Shapes: `H` heads, `Tq` queries (rows), `Tk` keys.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
import torch
from matplotlib import font_manager
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from qkv.errors import ConfigError, DataError, QkvError, file_in_the_way
from qkv.training.checkpoint import in_place, replacing

DPI = 110
MAX_COLUMNS = 4

# DejaVu Sans ships with matplotlib (Latin, Greek, Cyrillic); the others, used where
# installed, cover scripts it lacks (CJK, Arabic, Devanagari, ...).
PREFERRED_FONTS = (
    "DejaVu Sans",
    "Noto Sans",
    "Noto Sans CJK SC",
    "Noto Sans CJK JP",
    "Noto Sans SC",
    "Source Han Sans SC",
    "WenQuanYi Zen Hei",
    "Microsoft YaHei",
    "SimHei",
    "Noto Sans Arabic",
    "Noto Sans Devanagari",
    "Noto Sans Hebrew",
    "Arial Unicode MS",
)

# Inches of one token cell, one character of a tick label, and the smallest panel.
_CELL_INCHES = 0.24
_CHAR_INCHES = 0.075
_MIN_PANEL_INCHES = 2.6
MAX_FIGURE_INCHES = 48.0
"""The longest side of a figure; larger figures are scaled down, naming every k-th token."""


@dataclass
class AttentionPanel:
    """One heatmap: how much each query position attends to each key position."""

    weights: torch.Tensor | np.ndarray  # (Tq, Tk) on any device; fully masked rows are 0
    query_tokens: list[str]  # the Tq row labels
    key_tokens: list[str]  # the Tk column labels
    title: str  # e.g. "encoder self · layer 2 · head 3"

    def __post_init__(self) -> None:
        shape = tuple(self.weights.shape)
        expected = (len(self.query_tokens), len(self.key_tokens))
        if shape != expected:
            raise ValueError(
                f"attention panel {self.title!r}: weights have shape {shape} but there are "
                f"{expected[0]} query and {expected[1]} key tokens"
            )

    def as_array(self) -> np.ndarray:
        """The weights as a float32 numpy array, (Tq, Tk)."""
        return torch.as_tensor(self.weights).detach().to("cpu", torch.float32).numpy()


def select_panels(
    maps: dict[str, list[torch.Tensor]],
    query_tokens_by_kind: dict[str, list[str]],
    key_tokens_by_kind: dict[str, list[str]],
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
) -> list[AttentionPanel]:
    """Picks the (layer, head) maps of one sentence to draw, as panels ordered by kind, layer
    and head and titled with 0-based indices, e.g. "cross · layer 0 · head 3". `maps` holds,
    per kind, one (H, Tq, Tk) tensor per layer; `layers` and `heads` are the indices to keep,
    in the order given (None keeps all)."""
    panels = []
    for kind, per_layer in maps.items():
        for layer in _checked_indices(layers, len(per_layer), "layer", kind):
            weights_HQK = per_layer[layer]
            queries, keys = query_tokens_by_kind[kind], key_tokens_by_kind[kind]
            for head in _checked_indices(heads, weights_HQK.shape[0], "head", kind):
                title = f"{kind} · layer {layer} · head {head}"
                panels.append(AttentionPanel(weights_HQK[head], list(queries), list(keys), title))
    return panels


def _checked_indices(wanted: Sequence[int] | None, count: int, what: str, kind: str) -> list[int]:
    """`wanted` (or all of 0..count-1), each index checked to be in range."""
    if wanted is None:
        return list(range(count))
    for index in wanted:
        if not 0 <= index < count:
            raise QkvError(
                f"{what} {index} is out of range: the {kind} attention has {count} "
                f"{what}{'s' if count > 1 else ''} (0..{count - 1})"
            )
    return list(dict.fromkeys(wanted))


def plot_attention(
    panels: Sequence[AttentionPanel], out_path: str | Path, title: str | None = None
) -> Path:
    """Draws attention heatmaps in a grid to a picture (see `save_figure`); returns its path.
    The grid is roughly square, at most four columns wide. Panels are sized to keep every
    token readable, up to `MAX_FIGURE_INCHES` a side; beyond that the figure is scaled down,
    and a panel whose cells get too small names every k-th token. All panels share one
    colour scale from 0 to 1."""
    if not panels:
        raise QkvError("there are no attention maps to plot")
    n_columns = min(MAX_COLUMNS, math.ceil(math.sqrt(len(panels))))
    n_rows = math.ceil(len(panels) / n_columns)
    panel_width = max(_panel_size(p.key_tokens, p.query_tokens) for p in panels)
    panel_height = max(_panel_size(p.query_tokens, p.key_tokens) for p in panels)
    width = n_columns * panel_width + 0.9  # + colour bar
    height = n_rows * panel_height + (0.5 if title else 0.0)
    scale = min(1.0, MAX_FIGURE_INCHES / width, MAX_FIGURE_INCHES / height)

    with _multilingual_text():
        figure = Figure(figsize=(width * scale, height * scale), dpi=DPI, layout="constrained")
        FigureCanvasAgg(figure)
        axes = list(figure.subplots(n_rows, n_columns, squeeze=False).flat)
        for ax in axes[len(panels) :]:
            ax.set_axis_off()
        for ax, panel in zip(axes, panels, strict=False):
            image = ax.imshow(panel.as_array(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
            keys, queries = panel.key_tokens, panel.query_tokens
            # k chosen per panel, so that a short source beside a long output keeps its names.
            every = _every(keys, queries, panel_width * scale)
            ax.set_xticks(range(0, len(keys), every), keys[::every], rotation=90)
            every = _every(queries, keys, panel_height * scale)
            ax.set_yticks(range(0, len(queries), every), queries[::every])
            ax.tick_params(labelsize=8)
            ax.set_xlabel("keys", fontsize=8)
            ax.set_ylabel("queries", fontsize=8)
            ax.set_title(panel.title, fontsize=9)
        figure.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
        if title:
            figure.suptitle(title)
        return save_figure(figure, out_path)


def _every(along: Sequence[str], across: Sequence[str], inches: float) -> int:
    """k such that naming every k-th token `along` an axis `inches` long gives each name a
    cell's room, after the labels `across` take theirs."""
    needed = len(along) * _CELL_INCHES
    return max(1, math.ceil(needed / max(inches - _label_room(across), _CELL_INCHES) - 1e-9))


def _panel_size(along: Sequence[str], across: Sequence[str]) -> float:
    """Inches a panel needs in one direction: a cell per token `along` it, plus room for the
    longest label `across` it (the other axis's)."""
    return max(_MIN_PANEL_INCHES, len(along) * _CELL_INCHES + _label_room(across))


def _label_room(across: Sequence[str]) -> float:
    """Inches the labels `across` a direction take in it, with the axis and its title."""
    return max((len(token) for token in across), default=0) * _CHAR_INCHES + 0.8


@contextmanager
def _multilingual_text() -> Iterator[None]:
    """Text drawn as it is (a "$" is a dollar, not TeX) with the installed `PREFERRED_FONTS`
    as fallbacks, without warnings about glyphs no font has."""
    installed = {font.name for font in font_manager.fontManager.ttflist}
    fonts = [name for name in PREFERRED_FONTS if name in installed] or ["sans-serif"]
    settings = matplotlib.rc_context({"font.family": fonts, "text.parse_math": False})
    with settings, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph .* missing from")
        yield


def save_figure(figure: Figure, out_path: str | Path) -> Path:
    """Writes a figure on an Agg canvas atomically (readers see the old file or the new, never
    half), in the format its suffix names (PNG without one); makes missing parent directories
    and returns its path. A device, pipe or open file's name (`in_place`) is written where it
    is, and a symbolic link through."""
    out_path = Path(out_path)
    kinds = figure.canvas.get_supported_filetypes()
    kinds.pop("pgf", None)  # LaTeX's, which needs LaTeX installed
    kind = out_path.suffix.lower().removeprefix(".") or "png"
    if kind not in kinds:
        raise ConfigError(
            f"{out_path}: cannot draw a '.{kind}' picture; use one of "
            + ", ".join(f".{name}" for name in sorted(kinds))
        )
    if out_path.is_dir():
        raise DataError(out_path, "is a directory; give a file name such as maps.png")
    blocking = file_in_the_way(out_path.parent)
    if blocking is not None:
        raise DataError(out_path, f"cannot write: {blocking} is a file, not a directory")
    try:
        if in_place(out_path):  # a device or pipe, or /dev/stdout: never replaced
            with open(out_path, "ab") as handle:  # appended to, as the shell opened it
                figure.savefig(handle, format=kind, dpi=DPI)
            return out_path
        out_path.parent.mkdir(parents=True, exist_ok=True)
        target = out_path.resolve()  # a symbolic link is written through
        with replacing(target) as temp_path, open(temp_path, "wb") as temp_file:
            figure.savefig(temp_file, format=kind, dpi=DPI)
    except OSError as error:
        raise DataError(out_path, f"cannot write ({error.strerror or error})") from None
    return out_path
