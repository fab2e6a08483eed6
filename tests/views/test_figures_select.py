"""Selections: shift-click several query tokens (head and matrix views share them), and the mean of the selected
heads drawn as one map; the figure of the view shows exactly that selection."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import attnscope
from attnscope.tracing.one_pass import Trace, trace
from attnscope.views import to_html

NS = "{http://www.w3.org/2000/svg}"
FIGURE = "() => window.attnscope.figureSVG(document.getElementById('attnscope-root'))"


@pytest.fixture(scope="module")
def sentence(minilm: attnscope.Model) -> Trace:
    return trace("The quick brown fox jumps over the lazy dog.", model=minilm)


def drawn_lines(page: Any, n: int) -> tuple[np.ndarray, str]:
    """The figure's lines as a [query, key] opacity matrix, and its caption."""
    root = ET.fromstring(page.evaluate(FIGURE).encode("utf-8"))
    lines = list(root.iter(f"{NS}line"))
    row = float(lines[0].get("y1", "0")) * 2 if lines else 1.0
    drawn = np.zeros((n, n))
    for line in lines:  # only rows of drawn queries: the first line of a figure may not be query 0's
        q, k = (int(float(line.get(a, "0")) // 18) for a in ("y1", "y2"))
        drawn[q, k] = float(line.get("stroke-opacity", "0"))
    assert row > 0
    # the caption's lines (wrapped at their " · " to the figure's width) joined back
    caption = " · ".join(t.text or "" for g in root.iter(f"{NS}g") if g.get("class") == "caption" for t in g)
    return drawn, caption


def test_shift_click_selects_several_queries(open_page: Callable[..., Any], sentence: Trace) -> None:
    opened = open_page(to_html(sentence, "all", layer=1, show_heads=[4]), "select-queries")
    page = opened.page
    page.click('.as-q .as-tok[data-index="2"]')
    page.click('.as-q .as-tok[data-index="5"]', modifiers=["Shift"])
    page.click('.as-q .as-tok[data-index="7"]', modifiers=["Shift"])
    page.mouse.move(0, 0)  # hovering a token shows only its lines: leave the columns
    focused = page.eval_on_selector_all(".as-q .as-tok.as-focus", "ts => ts.map(t => Number(t.dataset.index))")
    assert focused == [2, 5, 7]
    drawn, caption = drawn_lines(page, sentence.n_tokens)
    assert set(np.nonzero(drawn.any(axis=1))[0]) == {2, 5, 7}  # lines from the selected queries only
    assert "queries 2: quick, 5: jumps, 7: the" in caption
    page.click('.as-q .as-tok[data-index="5"]', modifiers=["Shift"])  # shift-click again: off
    page.mouse.move(0, 0)
    assert page.eval_on_selector_all(".as-q .as-tok.as-focus", "ts => ts.length") == 2
    page.click(".as-tab[data-view=matrix]")  # the matrix adds rows to the same selection
    cell, label = (float(page.get_attribute("canvas.as-matrix", f"data-{a}")) for a in ("cell", "label"))
    page.click("canvas.as-matrix", position={"x": label + cell * 3.5, "y": label + cell * 9.5}, modifiers=["Shift"])
    page.click(".as-tab[data-view=head]")
    page.mouse.move(0, 0)
    focused = page.eval_on_selector_all(".as-q .as-tok.as-focus", "ts => ts.map(t => Number(t.dataset.index))")
    assert focused == [2, 7, 9] and opened.errors == []


def test_mean_of_the_selected_heads(open_page: Callable[..., Any], sentence: Trace) -> None:
    opened = open_page(to_html(sentence, "head", layer=2, show_heads=[0, 3, 8]), "select-mean")
    page = opened.page
    page.click(".as-mean")
    assert page.get_attribute(".as-mean", "aria-pressed") == "true"
    drawn, caption = drawn_lines(page, sentence.n_tokens)
    mean = sentence.weights[2][[0, 3, 8]].mean(axis=0)  # [query, key]
    steps = sentence.weights[2][[0, 3, 8]].max(axis=(1, 2)).mean() / 510 + mean.max() / 510  # 8-bit, twice
    kept = mean >= 0.011 + steps
    assert kept.sum() > 10 and np.abs(drawn[kept] - mean[kept]).max() <= steps + 5e-4
    assert (drawn[mean < 0.009 - steps] == 0).all()
    assert "mean of the selected heads" in caption and "heads 0, 3, 8" in caption
    assert "✓ verified · layer 2, 3 heads" in caption
    page.click(".as-mean")
    drawn, _ = drawn_lines(page, sentence.n_tokens)
    assert (drawn > 0).sum() > (kept.sum())  # three heads' lines again
    assert opened.errors == []
