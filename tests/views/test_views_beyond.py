"""The views' source switch on rollout, flow and norm-based attention, driven in headless Chromium."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import attnscope
from attnscope.norms import norm_attention
from attnscope.tracing.one_pass import Trace, trace
from attnscope.verify.recompute import layer_params
from attnscope.views.browser import READY, chromium

TEXT = "The cat sat on the mat."
SOURCE = 'select[aria-label="what to draw"]'
LAYER = 'select[aria-label="layer (0-indexed)"]'


@pytest.fixture(scope="module")
def full_trace(minilm: attnscope.Model) -> Trace:
    tr = trace(TEXT, model=minilm)
    tr.rollout()
    tr.flow()
    w_o = [p.w_o.numpy() for p in layer_params(minilm.model) or []]
    tr.arrays.update(norm_attention(tr.arrays["v"], tr.weights, w_o))
    return tr


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


def _open(browser: Any, document: str, path: Path) -> Any:
    path.write_text(document, encoding="utf-8")
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.goto(path.as_uri())
    page.wait_for_selector(READY, state="attached", timeout=60_000)
    return page


@pytest.fixture(scope="module")
def matrix_page(browser: Any, full_trace: Trace, tmp_path_factory: pytest.TempPathFactory) -> Any:
    page = _open(browser, full_trace.to_html(view="matrix"), tmp_path_factory.mktemp("views") / "matrix.html")
    page.evaluate("""() => { window.picked = [];
        document.addEventListener('attnscope:select', e => window.picked.push(e.detail)); }""")
    return page


def _select_cell(page: Any, start: tuple[int, int], q: int, k: int) -> None:
    """Move the matrix cursor with the arrow keys from `start` to (q, k) and press Enter, as a person would."""
    page.focus("canvas.as-matrix")
    dq, dk = q - start[0], k - start[1]
    moves = (("ArrowDown" if dq > 0 else "ArrowUp", abs(dq)), ("ArrowRight" if dk > 0 else "ArrowLeft", abs(dk)))
    for key, count in moves:
        for _ in range(count):
            page.keyboard.press(key)
    page.keyboard.press("Enter")


def test_source_switch_offers_every_computed_array(matrix_page: Any) -> None:
    options = matrix_page.eval_on_selector_all(f"{SOURCE} option", "os => os.map(o => [o.value, o.textContent])")
    assert options == [["weights", "attention weights"], ["norm_head", "norm-based, per head"],
                       ["rollout", "attention rollout"], ["norm_layer", "norm-based, per layer"],
                       ["flow", "attention flow"]]


def test_matrix_view_shows_each_source_value(matrix_page: Any, full_trace: Trace) -> None:
    # (source, layer, head, query, key, the number the trace holds); layer/head None where the source has no such axis
    cases = [
        ("rollout", 4, None, 2, 5, full_trace.arrays["rollout"][4, 2, 5]),
        ("flow", None, None, 0, 3, full_trace.arrays["flow"][0, 3]),
        ("norm_head", 3, 7, 5, 1, full_trace.arrays["norm_head"][3, 7, 5, 1]),
        ("norm_layer", 1, None, 8, 0, full_trace.arrays["norm_layer"][1, 8, 0]),
    ]
    position = (0, 0)
    for name, layer, head, q, k, expected in cases:
        matrix_page.select_option(SOURCE, name)
        assert matrix_page.is_disabled(LAYER) == (layer is None)
        if layer is not None:
            matrix_page.select_option(LAYER, str(layer))
        if head is not None:
            matrix_page.click(f'.as-chip[data-head="{head}"]')
        _select_cell(matrix_page, position, q, k)
        position = (q, k)
        info = matrix_page.inner_text(".as-info")
        label = {"rollout": "attention rollout", "flow": "attention flow", "norm_head": "norm-based, per head",
                 "norm_layer": "norm-based, per layer"}[name]
        match = re.search(rf"{label}: ≈ ([0-9.e+-]+) \(8-bit approximation, within ±([0-9.e+-]+)\)", info)
        assert match, info
        shown, step = float(match.group(1)), float(match.group(2))
        # uint8 quantization (at most step) plus the 4 significant digits shown
        assert abs(shown - float(expected)) <= 1.05 * step + 5e-4 * abs(float(expected)), (name, shown, expected)
        event = matrix_page.evaluate("() => window.picked[window.picked.length - 1]")
        assert event == {"view": "matrix", "layer": layer, "head": head, "query": q, "key": k, "source": name}


def test_saved_trace_opens_on_a_derived_source(browser: Any, full_trace: Trace, tmp_path: Path) -> None:
    """Derived arrays survive save/load, and a page can start on one of them."""
    full_trace.save(tmp_path / "t.safetensors")
    loaded = Trace.load(tmp_path / "t.safetensors")
    for name in ("rollout", "flow", "norm_head", "norm_layer"):
        assert np.array_equal(loaded.arrays[name], full_trace.arrays[name])
    page = _open(browser, loaded.to_html(view="matrix", source="flow"), tmp_path / "flow.html")
    assert page.input_value(SOURCE) == "flow"
    assert page.is_disabled(LAYER)  # flow has no layer axis
    assert page.eval_on_selector_all(".as-chip", "cs => cs.every(c => c.disabled)")  # nor a head axis


def test_head_and_model_views_draw_every_source(browser: Any, full_trace: Trace, tmp_path: Path) -> None:
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    (tmp_path / "all.html").write_text(full_trace.to_html(view="all"), encoding="utf-8")
    page.goto((tmp_path / "all.html").as_uri())
    page.wait_for_selector(READY, state="attached", timeout=60_000)
    sources = ("weights", "rollout", "flow", "norm_head", "norm_layer")
    for view in ("head", "model", "matrix"):
        page.click(f'.as-tab[data-view="{view}"]')
        drawn = set()
        for name in sources:
            page.select_option(f".as-panel {SOURCE}", name)
            assert page.input_value(f".as-panel {SOURCE}") == name
            drawn.add(page.evaluate(
                "() => Array.from(document.querySelectorAll('.as-panel canvas')).map(c => c.toDataURL()).join()"))
        assert len(drawn) == len(sources), view  # each source draws a different picture
    assert errors == []
