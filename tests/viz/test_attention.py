"""Attention heatmaps: panel selection and PNG rendering."""

from __future__ import annotations

import os
import stat
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib import image as mpimg
from matplotlib.figure import Figure

from qkv.errors import ConfigError, QkvError
from qkv.viz import attention
from qkv.viz.attention import (
    DPI,
    MAX_FIGURE_INCHES,
    AttentionPanel,
    plot_attention,
    select_panels,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def random_weights(n_queries: int, n_keys: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n_queries, n_keys, generator=generator).softmax(dim=-1)


def panel(queries: list[str], keys: list[str], title: str, seed: int = 0) -> AttentionPanel:
    return AttentionPanel(random_weights(len(queries), len(keys), seed), queries, keys, title)


def assert_readable_png(path: Path) -> np.ndarray:
    assert path.read_bytes()[:8] == PNG_MAGIC
    pixels = mpimg.imread(path)
    assert pixels.std() > 0  # not a blank canvas
    return pixels


GERMAN = ["Die", "Katze", "saß", "auf", "der", "Matte", "."]
ENGLISH = ["The", "cat", "sat", "on", "the", "mat", "."]


def test_grid_of_german_panels_is_written(tmp_path: Path) -> None:
    panels = [panel(ENGLISH, GERMAN, f"cross · layer 0 · head {h}", seed=h) for h in range(3)]
    out = plot_attention(panels, tmp_path / "nested" / "dir" / "cross.png", title="Katze")
    assert out == tmp_path / "nested" / "dir" / "cross.png"
    assert_readable_png(out)
    assert [p.name for p in out.parent.iterdir()] == ["cross.png"]  # no temporary left over


def test_non_latin_tokens_render_without_warnings(tmp_path: Path) -> None:
    russian = ["Кошка", "сидела", "на", "коврике", "."]
    chinese = ["猫", "坐", "在", "垫子", "上", "。"]
    panels = [
        panel(russian, russian, "encoder self · layer 0 · head 0"),
        panel(chinese, russian, "cross · layer 0 · head 0", seed=1),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = plot_attention(panels, tmp_path / "scripts.png")
    assert_readable_png(out)


def test_image_grows_with_the_number_of_panels(tmp_path: Path) -> None:
    one = plot_attention([panel(ENGLISH, GERMAN, "one")], tmp_path / "one.png")
    many = plot_attention(
        [panel(ENGLISH, GERMAN, f"head {h}", seed=h) for h in range(6)], tmp_path / "many.png"
    )
    height_one, width_one = assert_readable_png(one).shape[:2]
    height_many, width_many = assert_readable_png(many).shape[:2]
    assert width_many > width_one
    assert height_many > height_one


def test_numpy_weights_and_all_zero_rows_are_accepted(tmp_path: Path) -> None:
    weights = np.full((3, 4), 0.25)
    weights[2] = 0.0  # a fully masked query
    out = plot_attention(
        [AttentionPanel(weights, ["a", "b", "c"], list("wxyz"), "np")], tmp_path / "np.png"
    )
    assert_readable_png(out)


def test_overwrites_an_existing_file(tmp_path: Path) -> None:
    out = tmp_path / "map.png"
    out.write_bytes(b"old")
    plot_attention([panel(ENGLISH, GERMAN, "new")], out)
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_no_panels_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(QkvError, match="no attention maps"):
        plot_attention([], tmp_path / "empty.png")


def test_weights_must_match_the_tokens() -> None:
    with pytest.raises(ValueError, match="shape"):
        AttentionPanel(torch.zeros(3, 3), ["a", "b"], ["a", "b", "c"], "bad")


def attention_maps(n_layers: int = 2, n_heads: int = 4) -> dict[str, list[torch.Tensor]]:
    source, target = 5, 3
    return {
        "encoder self": [torch.rand(n_heads, source, source) for _ in range(n_layers)],
        "decoder self": [torch.rand(n_heads, target, target) for _ in range(n_layers)],
        "cross": [torch.rand(n_heads, target, source) for _ in range(n_layers)],
    }


SOURCE_TOKENS = ["Die", "Katze", "saß", ".", "</s>"]
TARGET_TOKENS = ["<s>", "The", "cat"]
QUERY_TOKENS = {
    "encoder self": SOURCE_TOKENS,
    "decoder self": TARGET_TOKENS,
    "cross": TARGET_TOKENS,
}
KEY_TOKENS = {"encoder self": SOURCE_TOKENS, "decoder self": TARGET_TOKENS, "cross": SOURCE_TOKENS}


def test_select_all_panels() -> None:
    panels = select_panels(attention_maps(), QUERY_TOKENS, KEY_TOKENS, layers=None, heads=None)
    assert len(panels) == 3 * 2 * 4
    assert panels[0].title == "encoder self · layer 0 · head 0"
    assert panels[-1].title == "cross · layer 1 · head 3"


def test_select_some_layers_and_heads() -> None:
    maps = attention_maps()
    panels = select_panels(maps, QUERY_TOKENS, KEY_TOKENS, layers=[1, 1], heads=[3, 0, 3])
    assert [p.title for p in panels] == [
        "encoder self · layer 1 · head 3",
        "encoder self · layer 1 · head 0",
        "decoder self · layer 1 · head 3",
        "decoder self · layer 1 · head 0",
        "cross · layer 1 · head 3",
        "cross · layer 1 · head 0",
    ]
    cross = panels[4]
    assert torch.equal(torch.as_tensor(cross.weights), maps["cross"][1][3])
    assert cross.query_tokens == TARGET_TOKENS
    assert cross.key_tokens == SOURCE_TOKENS


@pytest.mark.parametrize(
    ("layers", "heads", "message"),
    [
        ([2], None, "layer 2 is out of range"),
        (None, [4], "head 4 is out of range"),
        ([-1], None, "layer -1 is out of range"),
    ],
)
def test_out_of_range_index_is_an_error(
    layers: list[int] | None, heads: list[int] | None, message: str
) -> None:
    with pytest.raises(QkvError, match=message):
        select_panels(attention_maps(), QUERY_TOKENS, KEY_TOKENS, layers=layers, heads=heads)


def test_long_inputs_are_drawn_within_the_largest_figure(tmp_path: Path) -> None:
    tokens = [f"token{i}" for i in range(300)]
    panels = [panel(tokens, tokens, f"head {h}", seed=h) for h in range(4)]
    pixels = assert_readable_png(plot_attention(panels, tmp_path / "long.png"))
    assert max(pixels.shape[:2]) <= MAX_FIGURE_INCHES * DPI + 1


def test_a_short_panel_keeps_its_names_beside_long_ones_that_shrink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn: list[Figure] = []

    def keep(figure: Figure, path: str | Path) -> Path:
        drawn.append(figure)
        return Path(path)

    monkeypatch.setattr(attention, "save_figure", keep)
    source, output = GERMAN[:4], [f"word{i}" for i in range(60)]
    panels = [panel(source, source, "encoder self")]
    panels += [panel(output, output, f"decoder self · head {h}", seed=h) for h in range(35)]
    plot_attention(panels, tmp_path / "mixed.png")
    axes = drawn[0].axes
    assert [t.get_text() for t in axes[0].get_xticklabels()] == source
    assert 0 < len(axes[1].get_xticklabels()) < len(output)  # every k-th named


def test_a_pipe_is_written_where_it_is_and_a_link_through(tmp_path: Path) -> None:
    panels = [panel(ENGLISH, GERMAN, "cross · layer 0 · head 0")]
    fifo, read = tmp_path / "maps.png", bytearray()
    os.mkfifo(fifo)
    reader = threading.Thread(target=lambda: read.extend(fifo.read_bytes()), daemon=True)
    reader.start()
    plot_attention(panels, fifo)
    reader.join(timeout=30)
    assert read[:8] == PNG_MAGIC and stat.S_ISFIFO(fifo.stat().st_mode)  # not replaced
    target, link = tmp_path / "target.png", tmp_path / "link.png"
    link.symlink_to(target)
    plot_attention(panels, link)
    assert link.is_symlink() and target.read_bytes()[:8] == PNG_MAGIC


def test_dollars_are_drawn_as_dollars_and_pgf_is_not_offered(tmp_path: Path) -> None:
    panels = [panel(["$5", "and", "$6"], GERMAN, "cross · layer 0 · head 0")]
    for title in ("It cost $5 and $6", r"x $\notacommand$ y"):  # not TeX: no parse error
        assert_readable_png(plot_attention(panels, tmp_path / "m.png", title=title))
    with pytest.raises(ConfigError, match=r"cannot draw a '\.pgf' picture"):
        plot_attention(panels, tmp_path / "m.pgf")
