"""The effect grid page in headless Chromium: one cell per head with its value, a click opens that head in
the head view, NaN shows as NaN, hostile tokens stay text, and nothing is fetched."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import attnscope
from attnscope.interventions import ablate
from attnscope.views.browser import READY, chromium
from attnscope.views.effects import effects_html, effects_payload

TEXT = "the <b>cat</b> sat"
LAYER = 'select[aria-label="layer (0-indexed)"]'


@pytest.fixture(scope="module")
def page(minilm: attnscope.Model, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, list[str]]]:
    result = ablate(TEXT, model=minilm, each=True)
    assert result.grid is not None
    result.grid["embedding_distance"][0, 1] = np.nan  # a NaN must show as NaN
    path = tmp_path_factory.mktemp("fx") / "effects.html"
    path.write_text(effects_html(result, attnscope.trace(TEXT, model=minilm)), encoding="utf-8")
    with chromium() as browser:
        p = browser.new_page(viewport={"width": 1200, "height": 900})
        seen: list[str] = []
        p.on("request", lambda r: seen.append(r.url))
        p.on("pageerror", lambda e: seen.append(f"error: {e}"))
        p.goto(path.as_uri())
        p.wait_for_selector(READY, state="attached", timeout=60_000)
        yield p, result, [u for u in seen if u != path.as_uri()]


def test_grid_cells_carry_the_values(page: tuple[Any, Any, list[str]]) -> None:
    p, result, foreign = page
    first = p.eval_on_selector_all(".as-fx-block:first-of-type .as-fx-cell", "cs => cs.map(c => c.textContent)")
    grid = result.grid["embedding_distance"]
    assert len(first) == grid.size == 72
    assert first[1] == "NaN"
    assert float(first[5]) == pytest.approx(grid[0, 5], abs=5e-5)
    assert p.evaluate("() => document.querySelectorAll('b').length") == 0  # the token's markup stays text
    assert foreign == []


def test_click_opens_that_head(page: tuple[Any, Any, list[str]]) -> None:
    p, _, _ = page
    p.click('.as-fx-block:first-of-type .as-fx-cell[data-layer="4"][data-head="7"]')
    p.wait_for_function(f"() => document.querySelector('{LAYER}').value === '4'")
    pressed = p.eval_on_selector_all(".as-chip", "cs => cs.map(c => c.getAttribute('aria-pressed'))")
    assert pressed == ["false"] * 7 + ["true"] + ["false"] * 4
    assert p.eval_on_selector(".as-panel", "e => e.dataset.view") == "head"


def test_payload_of_a_patching(tiny_model: Any) -> None:
    from attnscope.interventions.patch import patch

    r = patch("the cat sat", "the dog sat", model=tiny_model("bert"))
    data = effects_payload(r)
    assert [g["name"] for g in data["grids"]] == ["denoised", "noised"]
    assert np.allclose(np.array(data["grids"][0]["values"], dtype=float), r.denoised, equal_nan=True)
