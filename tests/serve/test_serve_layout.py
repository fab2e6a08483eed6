"""The web app's layout at 1280x900 in headless Chromium: the neuron view fits its pane, a click opens the
explanation at the weights step and says which layer and head it explains, the tables scroll inside their box."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.serve import Server


@pytest.fixture(scope="module")
def app(server: Server) -> Iterator[Any]:
    from attnscope.views.browser import chromium

    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(server.url)
        page.wait_for_selector("#sv-status[data-kind=ok]", timeout=60_000)  # the default sentence, traced
        yield page
        page.close()


def test_neuron_view_fits_the_pane_at_1280(app: Any) -> None:
    app.select_option("#sv-view", "neuron")
    app.wait_for_selector("#sv-views .as-neuron-values")
    spill = app.evaluate("""() => {
      const pane = document.getElementById("sv-views").getBoundingClientRect();
      return [...document.querySelectorAll(".as-neuron-parts > div")].map((d) =>
        [d.scrollWidth - d.clientWidth, d.getBoundingClientRect().right - pane.right]);
    }""")
    assert spill and all(inner <= 0 and outer <= 0 for inner, outer in spill), spill
    assert app.evaluate("() => document.documentElement.scrollWidth") <= 1280


def test_a_clicked_cell_opens_the_explanation_at_the_weights_step(app: Any) -> None:
    app.select_option("#sv-view", "matrix")
    app.wait_for_selector("#sv-views canvas.as-matrix")
    app.locator("#sv-views .as-panel select").first.select_option("1")
    app.locator("#sv-views .as-chips button", has_text="3").first.click()
    canvas = app.locator("#sv-views canvas.as-matrix")
    cell, label = (float(canvas.get_attribute(f"data-{k}")) for k in ("cell", "label"))
    canvas.click(position={"x": label + 1.5 * cell, "y": label + 2.5 * cell})  # query 2, key 1
    app.wait_for_selector("#sv-explain[data-state=ready]", timeout=60_000)
    where = app.evaluate("""() => {
      const box = document.getElementById("sv-explain");
      const step = box.querySelector('.sv-step[data-stage="weights"]').getBoundingClientRect();
      const view = box.getBoundingClientRect();
      const wide = [...box.querySelectorAll(".sv-matrix")].map((m) => [m.scrollWidth > m.clientWidth,
        m.getBoundingClientRect().right - view.right]);
      return {title: box.querySelector("h2").textContent, top: step.top - view.top, scrolled: box.scrollTop,
              height: view.height, wide: wide};
    }""")
    assert where["title"].startswith("Layer 1, head 3, query token 2")
    assert where["scrolled"] > 0 and -2 <= where["top"] < where["height"] / 2  # the weights step, at the top
    assert any(scrolls for scrolls, _ in where["wide"])  # the 384-wide x scrolls inside its box
    assert all(out <= 1 for _, out in where["wide"])  # and no table sticks out of the explanation


def test_head_view_with_every_head_says_which_head_it_explains(app: Any) -> None:
    app.select_option("#sv-view", "head")
    app.wait_for_selector("#sv-views .as-tokens.as-q [data-index='2']", timeout=30_000)
    app.click("#sv-views .as-tokens.as-q [data-index='2']")
    app.wait_for_selector("#sv-explain[data-state=ready]", timeout=60_000)
    note = app.inner_text("#sv-explain .sv-which")
    assert "draws 12 heads; this explains layer" in note and "head 0, the first of them" in note
