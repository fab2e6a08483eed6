"""The web app's layout at 1280 and 1920 px (issue 29), measured in headless Chromium: in every view each element
stays inside the views' pane (nothing runs under the explanation panel, nothing needs a sideways scroll), the model
view shows every head's column, and the Generate panel's text wraps inside the page."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.pages import spills
from tests.support.serve import Server, start_server

TEXT = ("In the spring of that year the river rose above the old stone bridge, and the people of the town "
        "carried their books and their bread up to the church on the hill, where they waited for the water")


@pytest.fixture(scope="module")
def two_models() -> Iterator[Server]:
    s = start_server("--max-tokens", "64", "--model", "minilm", "--model", "smollm2")
    yield s
    assert s.stop() == 0, "".join(s.stderr)[-2000:]
    assert "Traceback" not in "".join(s.stderr), "".join(s.stderr)[-4000:]


def _trace(page: Any, model: str) -> None:
    page.select_option("#sv-model", model)
    page.fill("#sv-text", TEXT)
    page.click("#sv-go")
    page.wait_for_selector("#sv-status:not([data-kind=busy])", timeout=180_000)
    assert page.get_attribute("#sv-status", "data-kind") == "ok", page.text_content("#sv-status")


@pytest.mark.parametrize("width", [1280, 1920])
def test_every_view_fits_its_pane(two_models: Server, width: int) -> None:
    from attnscope.views.browser import chromium

    with chromium() as browser:
        page = browser.new_page(viewport={"width": width, "height": 1000})
        page.goto(two_models.url)
        page.wait_for_selector("#sv-status[data-kind=ok]", timeout=120_000)
        for model, heads in (("all-MiniLM-L6-v2", 12), ("smollm2", 9)):
            _trace(page, model)
            for view in ("head", "model", "matrix", "neuron"):
                page.select_option("#sv-view", view)
                page.wait_for_selector(f"#sv-views .as-panel[data-view={view}]", timeout=60_000)
                page.wait_for_timeout(300)  # the view settles (fit, lazy maps)
                fit = spills(page, "sv-views")
                assert fit == {"spills": [], "sideways": 0, "page": 0}, (model, view, fit)
                if view == "model":  # every head's column drawn inside the pane, none cut or scrolled away
                    right = page.evaluate("() => document.getElementById('sv-views').getBoundingClientRect().right")
                    edges = page.eval_on_selector_all('#sv-views .as-thumb[data-layer="0"]',
                                                      "ts => ts.map((t) => t.getBoundingClientRect().right)")
                    assert len(edges) == heads and max(edges) <= right, (model, edges, right)
        page.close()


@pytest.mark.parametrize("width", [1280, 1920])
def test_the_generate_panel_wraps_its_text(two_models: Server, width: int) -> None:
    from attnscope.views.browser import chromium

    with chromium() as browser:
        page = browser.new_page(viewport={"width": width, "height": 1000})
        page.goto(two_models.url)
        page.wait_for_selector("#sv-status[data-kind=ok]", timeout=120_000)
        page.fill("#sv-gen-prompt", TEXT)
        page.fill("#sv-gen-max", "12")
        page.click("#sv-gen-go")
        page.wait_for_selector("#sv-gen-view[data-state=done]", timeout=300_000)
        boxes = page.eval_on_selector_all("#sv-gen-view *", "es => es.map((e) => e.getBoundingClientRect().right)")
        assert boxes and max(boxes) <= width, max(boxes)
        assert page.evaluate("() => document.documentElement.scrollWidth") <= width
        page.close()
