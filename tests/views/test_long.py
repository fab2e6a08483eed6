"""Long contexts: the matrix view pans and zooms over tiles (a max-pooled overview, exact cells when zoomed), the head
view draws the strongest lines and says so, and a page over the size limit is refused before it is built."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import attnscope
from attnscope.bertviz import trace_from_attention
from attnscope.cli.main import main
from attnscope.errors import AttnscopeError
from attnscope.tracing.one_pass import Trace, trace
from attnscope.views import to_html
from attnscope.views.size import page_size
from tests.support.views import NEXT_FRAME, decode_source, page_payload

N = 2048
PEAK = 0.9
CANVAS = "canvas.as-matrix"
NS = "{http://www.w3.org/2000/svg}"


def peak_of(q: np.ndarray) -> np.ndarray:
    """The one strong key of each query: scattered over the map (a multiplicative hash), so blocks differ."""
    return (q * 7919 + 13) % N


@pytest.fixture(scope="module")
def long_trace() -> Trace:
    """2,048 tokens, 1 layer x 2 heads of weights: each query puts 0.9 on one key and spreads 0.1 over the rest."""
    rng = np.random.default_rng(0)
    weights = np.full((1, 2, N, N), 0.1 / (N - 1), dtype=np.float32)  # [layer, head, query, key]
    q = np.arange(N)
    weights[0, 0, q, peak_of(q)] = PEAK
    sparse = rng.random((N, N), dtype=np.float32) ** 40  # a few large values per row: many faint lines
    weights[0, 1] = sparse / sparse.sum(axis=-1, keepdims=True)
    return trace_from_attention(weights, [f"w{i}" for i in range(N)])


@pytest.fixture(scope="module")
def matrix_page(open_page: Callable[..., Any], long_trace: Trace) -> Any:
    return open_page(to_html(long_trace, "matrix", layer=0, head=0, theme="light"), "long-matrix")


def dataset(page: Any) -> dict[str, float]:
    return {k: float(v) for k, v in page.eval_on_selector(CANVAS, "c => ({...c.dataset})").items()}


def painted(page: Any) -> dict[str, float]:
    """The canvas's view once every input sent so far is drawn (NEXT_FRAME): the view paints in an animation frame,
    so a read right after a key or a drag can see the frame of an earlier step."""
    page.evaluate(NEXT_FRAME)
    return dataset(page)


def pixels(page: Any, points: list[tuple[float, float]]) -> list[list[int]]:
    """The canvas's RGBA at CSS pixels (x, y) (devicePixelRatio 1 here), read back once."""
    return list(page.eval_on_selector(CANVAS, """(c, points) => {
      const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
      const at = (x, y) => 4 * (Math.floor(y) * c.width + Math.floor(x));
      return points.map(([x, y]) => Array.from(d.subarray(at(x, y), at(x, y) + 4)));
    }""", points))


def figure(page: Any) -> ET.Element:
    svg = page.evaluate("() => window.attnscope.figureSVG(document.getElementById('attnscope-root'))")
    return ET.fromstring(svg.encode("utf-8"))


def group(root: ET.Element, name: str) -> ET.Element:
    return next(e for e in root.iter(f"{NS}g") if e.get("class") == name)


def caption(root: ET.Element) -> str:
    return " | ".join(t.text or "" for t in group(root, "caption"))


def faint_drawn(tr: Trace) -> int:
    """Head 1's lines at or above 0.01 after the page's 8-bit codes (what its figure can draw at all)."""
    w = tr.weights[0, 1].astype(np.float64)  # [query, key]
    codes = np.rint(w / w.max() * 255)
    return int((codes / 255 * w.max() >= 0.01).sum())


def test_overview_is_max_pooled_so_no_peak_disappears(matrix_page: Any) -> None:
    page = matrix_page.page
    d = dataset(page)
    assert d["cell"] < 1 and d["level"] >= 1  # a cell is under a pixel: each pixel is a block of 2^level cells
    f = 2 ** int(d["level"])
    assert f"each pixel is the max of {f} × {f} cells" in page.inner_text(".as-zoom-status")
    assert page.eval_on_selector_all("*", "a => a.length") < 400  # a canvas of tiles, never a node per cell
    at = lambda i: d["label"] + (i // f * f + f / 2) * d["cell"]  # noqa: E731  the middle of i's block
    peaks, empty = [], []
    for q in range(5, N, 97):  # a pixel whose block holds a peak is coloured; one whose block holds none is white
        k = int(peak_of(np.array(q)))
        peaks.append((at(k), at(q)))
        k_far = (k + N // 2) % N
        if all(int(peak_of(np.array(r))) // f != k_far // f for r in range(q // f * f, q // f * f + f)):
            empty.append((at(k_far), at(q)))
    white = [255, 255, 255, 255]
    assert len(peaks) > 15 and len(empty) > 15
    colours = pixels(page, peaks + empty)
    assert all(c != white for c in colours[: len(peaks)]) and all(c == white for c in colours[len(peaks):])
    root = figure(page)  # the figure of the whole map: 8 x 8 blocks, one rect per block that holds a peak
    assert "each cell the max of 8 × 8 (max-pooled)" in caption(root) and "as zoomed" not in caption(root)
    cells = [(float(r.get("y", "0")), float(r.get("x", "0"))) for r in group(root, "cells")]
    frame = next(r for r in root.iter(f"{NS}rect") if r.get("fill") == "none")  # the map's outline
    x0, y0, side = (float(frame.get(a, "0")) for a in ("x", "y", "width"))
    blocks = {(round((y - y0) / (side / 256)), round((x - x0) / (side / 256))) for y, x in cells}
    q = np.arange(N)
    assert blocks == {(int(a) // 8, int(b) // 8) for a, b in zip(q, peak_of(q), strict=True)}
    matrix_page.shot("long-matrix-overview")


def test_zoom_reaches_exact_cells_and_hover_shows_the_arrays_value(matrix_page: Any, long_trace: Trace) -> None:
    page = matrix_page.page
    box = page.query_selector(CANVAS).bounding_box()
    d = dataset(page)
    q, k = 1500, int(peak_of(np.array(1500)))
    while d["cell"] < 10:  # the wheel zooms around the pointer: keep it on the cell (q, k)
        page.mouse.move(box["x"] + d["label"] + (k + 0.5 - d["k0"]) * d["cell"],
                        box["y"] + d["label"] + (q + 0.5 - d["q0"]) * d["cell"])
        before = page.eval_on_selector(CANVAS, "c => c.dataset.cell")
        page.mouse.wheel(0, -600)  # x 8
        page.wait_for_function(f"() => document.querySelector('{CANVAS}').dataset.cell !== '{before}'")
        d = dataset(page)
    assert d["level"] == 0 and d["cell"] >= 10  # exact cells, big enough for token labels
    assert "cells of" in page.inner_text(".as-zoom-status")
    values = decode_source(page_payload(page.content())["sources"][0])[0, 0]  # [query, key] as the page carries
    for dq, dk in ((0, 0), (1, 0), (0, 2), (-3, 1)):
        page.mouse.move(box["x"] + d["label"] + (k + dk + 0.5 - d["k0"]) * d["cell"],
                        box["y"] + d["label"] + (q + dq + 0.5 - d["q0"]) * d["cell"])
        tip = page.inner_text(".as-tip").splitlines()
        assert tip[0] == f"query {q + dq}: w{q + dq} → key {k + dk}: w{k + dk}"
        shown = re.fullmatch(r"attention weights: ≈ (\d\.\d{4}) \(8-bit approximation, within ±(\d\.\d{4})\)", tip[1])
        assert shown, tip
        assert shown.group(1) == f"{values[q + dq, k + dk]:.4f}"  # the page's number is the decoded code
        w = float(long_trace.weights[0, 0, q + dq, k + dk])
        assert abs(float(shown.group(1)) - w) <= float(shown.group(2)) + 5e-5  # and the array's within its step
    matrix_page.shot("long-matrix-zoomed")
    root = figure(page)  # the figure shows the part in view, cell by cell, with its tokens
    zoomed = re.search(r"queries (\d+)–(\d+), keys (\d+)–(\d+) \(as zoomed\)", caption(root))
    assert zoomed and "max-pooled" not in caption(root)
    q_first, q_last, k_first, k_last = (int(x) for x in zoomed.groups())  # inclusive, 0-indexed
    assert q_first <= q <= q_last and k_first <= k <= k_last
    labels = [t.text for t in group(root, "tokens")]
    assert f"{q}: w{q}" in labels and f"{k}: w{k}" in labels
    assert len(labels) == (q_last - q_first + 1) + (k_last - k_first + 1)  # a label per row and column in view
    before = dataset(page)
    page.mouse.move(box["x"] + 300, box["y"] + 300)
    page.mouse.down()
    page.mouse.move(box["x"] + 200, box["y"] + 250, steps=5)  # a drag pans: 100 px right, 50 px down in the map
    page.mouse.up()
    after = painted(page)
    assert after["k0"] - before["k0"] == pytest.approx(100 / d["cell"]) and after["cell"] == before["cell"]
    assert after["q0"] - before["q0"] == pytest.approx(50 / d["cell"])
    assert page.inner_text(".as-info") == ""  # a drag selects nothing
    assert matrix_page.errors == [] and matrix_page.foreign_requests() == []


def test_real_trace_zoomed_hover_is_exact(minilm: attnscope.Model, open_page: Callable[..., Any]) -> None:
    tr = trace("attention heads read every token of this long and repetitive sentence again " * 60, model=minilm,
               max_length=128)
    opened = open_page(to_html(tr, "all", layer=0, head=0), "long-real", width=180)  # narrow: 128 cells < 128 px
    page = opened.page
    page.click(".as-tab[data-view=matrix]")
    d = dataset(page)
    assert d["level"] >= 1 and d["cell"] < 1  # the labels take their width first: the cells share what is left
    fit = d["cell"]
    page.focus(CANVAS)
    for key in ["+"] * 5:  # zoom by 2 per key, around the view's middle
        page.keyboard.press(key)
    d = painted(page)  # not the first frame at level 0: that can come before the last key (a CI run read it)
    assert d["level"] == 0 and d["cell"] == fit * 32
    box = page.query_selector(CANVAS).bounding_box()
    q, k = int(d["q0"]) + 2, int(d["k0"]) + 3
    page.mouse.move(box["x"] + d["label"] + (k + 0.5 - d["k0"]) * d["cell"],
                    box["y"] + d["label"] + (q + 0.5 - d["q0"]) * d["cell"])
    tip = page.inner_text(".as-tip").splitlines()
    assert tip[0].startswith(f"query {q}: ") and f"→ key {k}: " in tip[0]
    assert tip[1] == f"attention weights: {float(tr.weights[0, 0, q, k]):.4f}"  # the exact float32 the page carries
    assert opened.errors == []


def test_head_view_says_how_many_lines_it_draws(open_page: Callable[..., Any], long_trace: Trace) -> None:
    opened = open_page(to_html(long_trace, "head", layer=0, show_heads=[1]), "long-head")
    page = opened.page
    page.eval_on_selector(".as-head-body", "b => b.scrollTop = b.scrollHeight / 2")  # lines cross the middle band
    # all lines of the middle band, once still: the draw before the scroll reached the page (the top band, whose
    # lines may all fit, with no status) can also have drawn over 1,500 lines, so wait for the cut's own words
    page.wait_for_function("() => { const s = document.querySelector('.as-status'); return Number(s.dataset.drawn) > "
                           "1500 && s.dataset.partial === 'false' && s.textContent.startsWith('Showing'); }")
    status = page.inner_text(".as-status")
    found = re.fullmatch(r"Showing the ([\d,]+) strongest of ([\d,]+) lines in view \(opacity ≥ (\d\.\d{4}); lines "
                         r"below 0\.01 are never drawn\); hover a token to see all of its lines\.", status)
    assert found, status
    drawn, total = (int(found.group(i).replace(",", "")) for i in (1, 2))
    faint = int((long_trace.weights[0, 1] >= 0.0095).sum())  # every line the view could draw at all
    assert drawn <= 12_000 < total <= faint
    assert page.eval_on_selector("canvas.as-lines", "c => c.clientHeight") <= 900  # only the visible band
    page.hover('.as-q .as-tok[data-index="3"]')
    page.wait_for_function("() => document.querySelector('.as-status').textContent === ''")  # one token: all its lines
    opened.shot("long-head")
    root = figure(page)
    assert f"the 12,000 strongest of {faint_drawn(long_trace):,} lines drawn" in caption(root)
    assert len(list(root.iter(f"{NS}line"))) == 12_000
    assert opened.errors == []


def test_a_page_over_the_limit_is_refused_before_it_is_built(long_trace: Trace) -> None:
    size = page_size(long_trace)
    assert size.maps == 2 and size.cells == N * N and size.total > N * N * 2 * 4 / 3
    with pytest.raises(AttnscopeError, match=r"^this page would be up to 11 MB \(1 layers x 2 heads, 2 maps of "
                       r"4,194,304 cells\), over the max_mb=10 limit: pass fewer layers= and heads= .*raise max_mb$"):
        to_html(long_trace, "matrix", max_mb=10)
    one = page_payload(to_html(long_trace, "matrix", heads=[1], max_mb=10))
    assert one["heads"] == [1] and one["sources"][0]["shape"] == [1, 1, N, N]


def test_cli_carries_the_chosen_layers_and_heads_and_refuses_over_the_limit(
        capsys: pytest.CaptureFixture[str], minilm: attnscope.Model, tmp_path: Path) -> None:
    out = tmp_path / "f.html"
    code = main(["view", "time flies like an arrow", "--layers", "0,3", "--heads", "1,2", "-o", str(out)])
    assert code == 0 and out.exists()
    data = page_payload(out.read_text(encoding="utf-8"))
    assert data["layers"] == [0, 3] and data["heads"] == [1, 2] and data["sources"][0]["shape"][:2] == [2, 2]
    capsys.readouterr()
    big = tmp_path / "big.html"
    code = main(["view", "time flies like an arrow", "--max-mb", "0.2", "-o", str(big)])
    err = capsys.readouterr().err
    assert code == 2 and not big.exists() and err.count("\n") == 1
    assert re.fullmatch(r"attnscope: error: this page would be up to [\d.]+ MB \(6 layers x 12 heads, 72 maps of \d+ "
                        r"cells\), over the --max-mb 0\.2 limit: pass fewer --layers and --heads \(0-indexed, e\.g\. "
                        r"--layers 0,3 --heads 1,2\), or --neuron none \(the neuron view's exact numbers take "
                        r"[\d.]+ MB\), or raise --max-mb\n", err), err
    code = main(["view", "time flies", "--layers", "9", "-o", str(big)])
    assert code == 2 and "layer 9" in capsys.readouterr().err and not big.exists()


def test_head_view_draws_every_line_at_or_above_the_floor(open_page: Callable[..., Any]) -> None:
    """Few lines (all in view, under the limit): the counting sort keeps each line whose 8-bit code reaches 0.01."""
    rng = np.random.default_rng(1)
    n = 24
    w = rng.random((1, 3, n, n), dtype=np.float32) ** 8  # [layer, head, query, key]
    w /= w.sum(axis=-1, keepdims=True)
    opened = open_page(to_html(trace_from_attention(w, [f"t{i}" for i in range(n)]), "head", layer=0), "head-all")
    d = opened.page.eval_on_selector(".as-status", "s => ({...s.dataset})")
    top = w[0].astype(np.float64).max(axis=(-2, -1), keepdims=True)  # each map's scale
    expected = int((np.rint(w[0] / top * 255) / 255 * top >= 0.01).sum())
    assert 100 < expected < 12_000
    assert (int(d["drawn"]), int(d["total"]), d["partial"], d["pending"]) == (expected, expected, "false", "0")
    assert opened.errors == []
