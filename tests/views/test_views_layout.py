"""Layouts in real headless Chromium at the widths people use: 1280x900 (the web app's ~740 px pane) and 760 px."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from attnscope.tracing.one_pass import Trace
from attnscope.views import bundle, payload, to_html
from attnscope.views.page import json_for_script

OVERFLOW = ("() => [...document.querySelectorAll('.as-neuron-parts > div')].map(d => "
            "[d.scrollWidth - d.clientWidth, d.getBoundingClientRect().right])")


def hosted(data: dict[str, Any], width: int, options: str) -> str:
    """A page that draws the views in a pane `width` px wide, as the web app does beside its explanation."""
    return (f"<!doctype html><meta charset=utf-8><title>pane</title>{bundle()}"
            f"<main style='width:{width}px'><div id=attnscope-root></div></main>"
            f"<script>attnscope.render(document.getElementById('attnscope-root'), {json_for_script(data)}, "
            f"{options});</script>")


@pytest.mark.parametrize("viewport, pane", [(1280, 740), (760, 720)])
def test_neuron_view_fits_its_pane(pair_trace: Trace, open_page: Callable[..., Any], viewport: int,
                                   pane: int) -> None:
    data = payload(pair_trace, initial={"view": "neuron", "layer": 2, "head": 5, "query": 6})
    opened = open_page(hosted(data, pane, "{}"), f"neuron-pane-{pane}", width=viewport)
    page = opened.page
    page.wait_for_selector(".as-neuron-values")
    for spill, right in page.evaluate(OVERFLOW):
        assert spill <= 0 and right <= pane + 8  # nothing scrolls sideways, nothing sticks out of the pane
    assert page.evaluate("() => document.documentElement.scrollWidth") <= viewport
    scores, values = page.query_selector_all(".as-neuron-parts > div")
    assert values.bounding_box()["y"] > scores.bounding_box()["y"] + 100  # the weighted values wrapped below
    opened.shot(f"neuron-pane-{pane}")
    assert opened.errors == []


def test_weighted_values_and_their_sum_are_the_trace_numbers(pair_trace: Trace,
                                                              open_page: Callable[..., Any]) -> None:
    opened = open_page(to_html(pair_trace, "neuron", layer=1, head=3, query=4), "neuron-values", width=1280)
    page = opened.page
    page.wait_for_selector(".as-neuron-values")
    canvases = page.query_selector_all(".as-neuron-values canvas.as-vec")  # v, weight x v, context
    v, weights = pair_trace.arrays["v"][1, 3], pair_trace.weights[1, 3, 4]
    box = canvases[1].bounding_box()
    cw = box["width"] / v.shape[1]
    page.mouse.move(box["x"] + 5.5 * cw, box["y"] + 2.5 * 22)  # key 2, dimension 5
    tip = page.inner_text(".as-tip")
    assert tip.startswith("key 2: ") and f"{weights[2]:.4f} × v[5] = " in tip, tip
    assert float(tip.split("= ")[-1]) == pytest.approx(float(weights[2] * v[2, 5]), abs=5e-5)
    note = page.inner_text(".as-context-note")
    diff = float(note.rsplit("difference ", 1)[1].rstrip("."))
    assert diff <= 1e-6  # the sum of weight x v is the trace's context row
    context = pair_trace.arrays["context"][1, 3, 4]
    assert np.abs((weights[:, None] * v).sum(0) - context).max() <= 1e-6
    assert opened.errors == []


def test_standalone_head_view_uses_the_page_and_has_a_legend(minilm: Any, open_page: Callable[..., Any]) -> None:
    from attnscope.tracing.one_pass import trace

    tr = trace("time flies like an arrow", model=minilm)  # 7 tokens
    opened = open_page(to_html(tr, "head", layer=2), "head-standalone", width=1280)
    page = opened.page
    size = page.evaluate("""() => {
      const body = document.querySelector(".as-head-body").getBoundingClientRect();
      const lines = document.querySelector("canvas.as-lines").getBoundingClientRect();
      return [body.width, body.height, lines.width, document.querySelector(".as-tok").getBoundingClientRect().height];
    }""")
    width, height, lines, row = size
    assert row > 20 and height >= 7 * row and lines > 280 and width > 500, size  # not 280x130 in a 1280x900 page
    assert "line opacity = attention weight" in page.inner_text(".as-head-legend")
    page.hover('.as-q .as-tok[data-index="1"]')
    title = page.get_attribute('.as-k .as-tok[data-index="2"]', "title")
    assert title and title.startswith("2: flies · mean over 12 heads: ≈ ") and "(8-bit approximation)" in title
    mean = float(title.split("≈ ")[1].split(" ")[0])
    step = float(tr.weights[2, :, 1].max()) / 255  # the 8-bit step of the widest of these rows
    assert mean == pytest.approx(float(tr.weights[2, :, 1, 2].mean()), abs=step + 5e-5)
    opened.shot("head-standalone")
    assert opened.errors == []


def test_figures_carry_no_controls_or_hints(pair_trace: Trace, open_page: Callable[..., Any]) -> None:
    from attnscope.views.browser import AS_FIGURE

    opened = open_page(to_html(pair_trace, "neuron", layer=3, head=4, query=2), "neuron-figure", width=1280)
    page = opened.page
    page.wait_for_selector(".as-neuron-values")
    page.evaluate(AS_FIGURE)
    assert page.inner_text(".as-figure-caption") == "layer 3 · head 4 · query 2: cat (0-indexed)"
    from attnscope.numbers import scaling  # the one way the scaling is written, in Python and in the page
    assert page.inner_text(".as-scaling") == f"scaled = q · k {scaling(32, pair_trace.scaling[3])}"
    from attnscope.numbers import error, value  # one number format: the page's and Python's agree
    samples = [-1.42961, 0.0394469, 25.96493, 0.0, 5.4e-07, 1e-05, 1.2345e-12]
    shown = page.evaluate("xs => xs.map(x => [attnscope.fmt(x), attnscope.fmtError(x)])", samples)
    assert shown == [[value(x), error(x)] for x in samples]
    visible = page.evaluate("""() => [...document.querySelectorAll('.as-controls, select, button, .as-hint')]
      .filter((n) => n.offsetParent !== null).map((n) => n.className)""")
    notes = [c for c in visible if "as-modern" not in c]  # the RoPE/GQA note is a note too, when there is one
    assert notes == ["as-hint as-scaling", "as-hint as-context-note"], visible
    assert page.is_visible(".as-badge")  # the verification stays in the picture
    opened.shot("neuron-figure")
