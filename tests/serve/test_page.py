"""The web page at /, driven in headless Chromium: models listed, translations and labels shown,
the attention heatmap drawn with a row and a column per token, and hovering a row highlights
what that token attends to."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from qkv.serve.app import create_app
from qkv.serve.models import Served, load_served
from tests.serve.conftest import running

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not os.access(CHROMIUM, os.X_OK):
    pytest.skip("no Chromium to drive (/usr/bin/chromium is absent)", allow_module_level=True)

Page = sync_api.Page
expect = sync_api.expect

pytestmark = pytest.mark.usefixtures("one_thread")

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def url(translation_run: Path, classification_run: Path) -> Iterator[str]:
    served: dict[str, Served] = load_served([translation_run, classification_run])
    try:
        with running(create_app(served)) as address:
            yield address
    finally:
        for model in served.values():
            model.batcher.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def console() -> list[str]:
    """The page's console errors and uncaught exceptions."""
    return []


@pytest.fixture
def page(browser: Any, url: str, console: list[str]) -> Iterator[Page]:
    """The page, loaded, with its models listed."""
    context = browser.new_context(viewport={"width": 1100, "height": 900})
    page = context.new_page()
    page.set_default_timeout(20_000)
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda error: console.append(str(error)))
    page.goto(url + "/")
    expect(page.get_by_test_id("submit")).to_be_enabled()
    yield page
    context.close()


def run(page: Page, path: str, text: str) -> dict[str, Any]:
    """Type `text`, submit, and return the server's JSON answer once the page shows it."""
    answers = int(page.get_by_test_id("results").get_attribute("data-answers") or 0)
    page.get_by_test_id("text").fill(text)
    with page.expect_response(lambda r: r.url.endswith(path)) as response:
        page.get_by_test_id("submit").click()
    answer = response.value.json()
    expect(page.get_by_test_id("results")).to_have_attribute("data-answers", str(answers + 1))
    expect(page.get_by_test_id("result")).to_have_count(len(answer["results"]))
    return answer


def translate(page: Page, text: str = "3 March 2021", beam: int = 4, n_best: int = 3) -> Any:
    page.get_by_test_id("beam").fill(str(beam))
    page.get_by_test_id("n-best").fill(str(n_best))
    return run(page, "/translate", text)


def classify(page: Page, text: str = "a wonderful and brilliant film") -> Any:
    page.get_by_test_id("model").select_option("reviews")
    return run(page, "/classify", text)


def heatmap_shape(page: Page) -> tuple[int, int]:
    rows = page.locator("#heatmap tbody tr")
    columns = page.locator("#heatmap thead th[data-col]")
    return rows.count(), columns.count()


def test_the_page_loads_without_errors_and_lists_both_models(
    page: Page, console: list[str]
) -> None:
    models = page.get_by_test_id("model")
    assert models.locator("option").evaluate_all("os => os.map(o => o.value)") == [
        "dates",
        "reviews",
    ]
    expect(page.get_by_test_id("translate-options")).to_be_visible()
    expect(page.get_by_test_id("submit")).to_have_text("Translate")
    models.select_option("reviews")
    expect(page.get_by_test_id("translate-options")).to_be_hidden()
    expect(page.get_by_test_id("submit")).to_have_text("Classify")
    expect(page.get_by_test_id("model-info")).to_contain_text("neg, pos")
    expect(page.get_by_test_id("error")).to_be_hidden()
    assert console == []


def test_a_translation_shows_its_score_and_n_best_list(page: Page, console: list[str]) -> None:
    answer = translate(page, "3 March 2021\nMarch 4, 1999", beam=4, n_best=3)
    assert answer["model"] == "dates"
    for card, result in zip(page.get_by_test_id("result").all(), answer["results"], strict=True):
        expect(card.get_by_test_id("translation")).to_have_text(result["translation"])
        expect(card.get_by_test_id("score")).to_contain_text(f"{result['score']:.3f}")
        hypotheses = card.get_by_test_id("hypothesis")
        expect(hypotheses).to_have_count(3)
        for shown, hypothesis in zip(hypotheses.all(), result["n_best"], strict=True):
            expect(shown.locator(".hyp")).to_have_text(hypothesis["text"])
            expect(shown).to_contain_text(f"{hypothesis['score']:.3f}")
    assert console == []


def test_a_classification_shows_the_label_and_a_bar_per_label(
    page: Page, console: list[str]
) -> None:
    result = classify(page)["results"][0]
    expect(page.get_by_test_id("label")).to_have_text(result["label"])
    bars = page.get_by_test_id("probability")
    expect(bars).to_have_count(2)
    assert bars.evaluate_all("bs => bs.map(b => b.dataset.label)") == ["neg", "pos"]
    shown = bars.evaluate_all("bs => bs.map(b => Number(b.dataset.probability))")
    assert shown == pytest.approx(list(result["probabilities"].values()), abs=1e-6)
    widths = bars.locator(".fill").evaluate_all(
        "fs => fs.map(f => f.getBoundingClientRect().width)"
    )
    best = list(result["probabilities"]).index(result["label"])
    assert widths[best] == max(widths)
    weights = page.get_by_test_id("token-weight")
    expect(weights).to_have_count(len(result["attention"]["tokens"]))
    values = weights.evaluate_all("ws => ws.map(w => Number(w.dataset.weight))")
    assert values == pytest.approx(result["attention"]["token_weights"])
    assert console == []


def test_more_texts_than_attention_is_given_for_are_translated_without_it(
    page: Page, console: list[str]
) -> None:
    """Attention is on by default and given for at most 8 texts a request."""
    answer = translate(page, "\n".join(["3 March 2021"] * 9), beam=2, n_best=1)
    assert len(answer["results"]) == 9 and not any("attention" in r for r in answer["results"])
    expect(page.get_by_test_id("results")).to_contain_text(
        "attention weights are given for at most 8"
    )
    expect(page.get_by_test_id("error")).to_be_hidden()
    assert console == []


def test_the_heatmap_has_a_row_and_a_column_per_token(page: Page) -> None:
    attention = translate(page, beam=1, n_best=1)["results"][0]["attention"]
    source, target = len(attention["source_tokens"]), len(attention["target_tokens"])
    layers, heads = len(attention["cross"]), len(attention["cross"][0])
    explorer = page.get_by_test_id("explorer")
    expect(explorer).to_be_visible()
    expect(page.get_by_test_id("kind")).to_have_value("cross")
    expect(page.locator("#heatmap tbody tr")).to_have_count(target)
    assert heatmap_shape(page) == (target, source)
    assert page.locator("#heatmap tbody th").all_inner_texts() == attention["target_tokens"]
    expect(page.locator("#layer option")).to_have_count(layers + 1)  # and their mean
    expect(page.locator("#head option")).to_have_count(heads + 1)
    page.get_by_test_id("kind").select_option("encoder")
    expect(page.locator("#heatmap tbody tr")).to_have_count(source)
    assert heatmap_shape(page) == (source, source)
    page.get_by_test_id("kind").select_option("decoder")
    expect(page.locator("#heatmap tbody tr")).to_have_count(target)
    assert heatmap_shape(page) == (target, target)
    # a causal map: nothing above the diagonal
    above = page.locator("#heatmap td").evaluate_all(
        "cs => cs.filter(c => +c.dataset.col > +c.dataset.row).map(c => +c.dataset.weight)"
    )
    assert above and max(above) == 0

    tokens = classify(page)["results"][0]["attention"]["tokens"]
    expect(page.locator("#kind option")).to_have_count(1)
    expect(page.locator("#heatmap tbody tr")).to_have_count(len(tokens))
    assert heatmap_shape(page) == (len(tokens), len(tokens))


def test_the_heatmap_draws_the_chosen_head_and_the_mean_of_heads(page: Page) -> None:
    cross = translate(page, beam=1, n_best=1)["results"][0]["attention"]["cross"]
    last = cross[-1]
    rows, columns = len(last[0]), len(last[0][0])
    mean = [[sum(h[i][j] for h in last) / len(last) for j in range(columns)] for i in range(rows)]
    assert flat(cell_weights(page)) == pytest.approx(flat(mean), abs=1e-3)
    page.get_by_test_id("head").select_option("1")
    expect(page.locator("#heatmap td").first).to_have_attribute(
        "data-weight", f"{last[1][0][0]:.4f}"
    )
    assert flat(cell_weights(page)) == pytest.approx(flat(last[1]), abs=1e-3)
    page.get_by_test_id("layer").select_option("0")
    assert flat(cell_weights(page)) == pytest.approx(flat(cross[0][1]), abs=1e-3)


def cell_weights(page: Page) -> list[list[float]]:
    return page.locator("#heatmap tbody tr").evaluate_all(
        "rs => rs.map(r => [...r.querySelectorAll('td')].map(c => Number(c.dataset.weight)))"
    )


def flat(rows: list[list[float]]) -> list[float]:
    return [x for row in rows for x in row]


def test_hovering_a_row_highlights_what_it_attends_to(page: Page, console: list[str]) -> None:
    translate(page, "the 5th of May 2020", beam=1, n_best=1)
    strip = page.get_by_test_id("focus-strip").locator(".tok")

    def hover(row: int) -> tuple[list[str], list[str]]:
        page.locator(f'#heatmap tbody th[data-row="{row}"]').hover()
        expect(page.locator(f'#heatmap tbody tr[data-row="{row}"]')).to_have_class(
            re.compile(r"\bactive\b")
        )
        expect(page.get_by_test_id("focus-strip")).to_have_attribute("data-row", str(row))
        expect(page.locator("#heatmap tbody tr.active")).to_have_count(1)
        weights = strip.evaluate_all("ts => ts.map(t => t.dataset.weight)")
        colours = strip.evaluate_all("ts => ts.map(t => getComputedStyle(t).backgroundColor)")
        return weights, colours

    rows = cell_weights(page)
    first, last = 0, len(rows) - 1
    weights_first, colours_first = hover(first)
    assert [float(w) for w in weights_first] == pytest.approx(rows[first], abs=1e-4)
    weights_last, colours_last = hover(last)
    assert [float(w) for w in weights_last] == pytest.approx(rows[last], abs=1e-4)
    assert rows[first] != rows[last]
    assert weights_first != weights_last
    assert colours_first != colours_last
    expect(page.get_by_test_id("focus-caption")).to_contain_text(f"{last + 1} of {len(rows)}")
    assert console == []


def test_refusals_are_shown_in_the_error_message(page: Page) -> None:
    error = page.get_by_test_id("error")
    page.get_by_test_id("beam").fill("4")
    page.get_by_test_id("n-best").fill("7")  # over the beam: refused before sending
    page.get_by_test_id("text").fill("3 March 2021")
    page.get_by_test_id("submit").click()
    expect(error).to_be_visible()
    expect(error).to_contain_text("cannot exceed the beam width")

    page.get_by_test_id("n-best").fill("1")
    page.get_by_test_id("text").fill("x" * 2500)  # over the server's 2000 characters a text
    with page.expect_response(lambda r: r.url.endswith("/translate")) as response:
        page.get_by_test_id("submit").click()
    assert response.value.status == 413
    expect(error).to_contain_text("at most 2000")
    expect(error).to_contain_text("texts[0]")
    expect(page.get_by_test_id("submit")).to_be_enabled()

    page.get_by_test_id("text").fill("3 March 2021")
    with page.expect_response(lambda r: r.url.endswith("/translate")):
        page.get_by_test_id("submit").click()
    expect(error).to_be_hidden()
    expect(page.get_by_test_id("translation")).to_have_count(1)


def test_a_narrow_window_scrolls_no_wider_than_itself(browser: Any, url: str) -> None:
    context = browser.new_context(viewport={"width": 360, "height": 740})
    page = context.new_page()
    page.goto(url + "/")
    expect(page.get_by_test_id("submit")).to_be_enabled()
    translate(page, "the 5th of May 2020", beam=2, n_best=2)
    expect(page.get_by_test_id("heatmap")).to_be_visible()
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 360
    context.close()
