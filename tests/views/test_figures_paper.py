"""Figures ready for a paper: one page per PDF, a colour bar with its scale on every heatmap, a box cut to what is
drawn, the neuron figure with q, k, q x k and the score (the trace's own numbers), and the caption optional."""

from __future__ import annotations

import base64
import re
import struct
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import attnscope
from attnscope.tracing.one_pass import Trace, trace
from attnscope.views import to_html
from attnscope.views.figures import figure
from tests.support.cli import run

NS = "{http://www.w3.org/2000/svg}"
TEXT = "The cat sat on the mat because it was tired."
ROOT = "document.getElementById('attnscope-root')"
VIEWS = [("head", {"layer": 2, "show_heads": [7]}), ("matrix", {"layer": 1, "head": 3}), ("model", {}),
         ("neuron", {"layer": 0, "head": 1, "query": 2})]
# The non-white box of a PNG (data: URL), read back pixel by pixel in the browser: [width, height, x0, y0, x1, y1].
INK = """async (url) => {
  const img = new Image();
  img.src = url;
  await img.decode();
  const c = document.createElement("canvas");
  [c.width, c.height] = [img.naturalWidth, img.naturalHeight];
  const g = c.getContext("2d");
  g.drawImage(img, 0, 0);
  const d = g.getImageData(0, 0, c.width, c.height).data;
  let [x0, y0, x1, y1] = [c.width, c.height, 0, 0];
  for (let y = 0; y < c.height; y++) for (let x = 0; x < c.width; x++) {
    const i = (y * c.width + x) * 4;
    if (Math.min(d[i], d[i + 1], d[i + 2]) >= 245) continue;
    [x0, y0, x1, y1] = [Math.min(x0, x), Math.min(y0, y), Math.max(x1, x + 1), Math.max(y1, y + 1)];
  }
  return [c.width, c.height, x0, y0, x1, y1];
}"""


@pytest.fixture(scope="module")
def cat(minilm: attnscope.Model) -> Trace:
    return trace(TEXT, model=minilm)


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg.encode("utf-8"))
    assert root.tag == f"{NS}svg"
    return root


def group(root: ET.Element, cls: str, key: int | None = None) -> ET.Element:
    return next(g for g in root.iter(f"{NS}g") if g.get("class") == cls
                and (key is None or g.get("data-key") == str(key)))


def by_class(root: ET.Element, cls: str) -> list[str]:
    return [t.text or "" for t in root.iter(f"{NS}text") if t.get("class") == cls]


def rgb(fill: str) -> tuple[int, int, int]:
    """#rrggbb or rgb(r,g,b) -> (r, g, b)."""
    if fill.startswith("#"):
        return int(fill[1:3], 16), int(fill[3:5], 16), int(fill[5:7], 16)
    r, g, b = (int(v) for v in fill[4:-1].split(","))
    return r, g, b


def figure_svg(open_page: Callable[..., Any], tr: Trace, view: str, name: str, **options: Any) -> ET.Element:
    opened = open_page(to_html(tr, view, theme="light", **options), name)
    svg = opened.page.evaluate(f"() => window.attnscope.figureSVG({ROOT})")
    assert opened.errors == [] and opened.foreign_requests() == []
    return parse(svg)


def pdf_pages(data: bytes) -> int:
    """The page objects of a PDF (`/Type /Page`, not the `/Pages` tree): Chromium writes them uncompressed."""
    assert data[:5] == b"%PDF-" and b"/ObjStm" not in data
    return len(re.findall(rb"/Type\s*/Page(?![A-Za-z])", data))


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


@pytest.mark.parametrize(("view", "options"), VIEWS)
def test_every_pdf_is_one_page_of_the_figures_shape(cat: Trace, tmp_path: Path, view: str,
                                                    options: dict[str, Any]) -> None:
    pdf = figure(cat, tmp_path / f"{view}.pdf", view, **options).read_bytes()
    svg = parse(figure(cat, tmp_path / f"{view}.svg", view, **options).read_text(encoding="utf-8"))
    assert pdf_pages(pdf) == 1
    box = re.search(rb"/MediaBox\s*\[\s*0 0 ([\d.]+) ([\d.]+)\s*\]", pdf)
    assert box is not None
    shape = float(svg.get("width", "0")) / float(svg.get("height", "1"))
    assert float(box.group(1)) / float(box.group(2)) == pytest.approx(shape, rel=0.02)  # the page is the figure


@pytest.mark.parametrize(("view", "options"), VIEWS)
def test_figures_are_cut_to_what_they_draw(browser: Any, cat: Trace, tmp_path: Path, view: str,
                                           options: dict[str, Any]) -> None:
    """The ink (non-white pixels) of the PNG fills nearly all of it and touches no edge: no white band beside a
    long caption, nothing cut off."""
    png = figure(cat, tmp_path / f"{view}.png", view, **options).read_bytes()
    page = browser.new_page()
    width, height, x0, y0, x1, y1 = page.evaluate(INK, "data:image/png;base64," + base64.b64encode(png).decode())
    page.close()
    assert (width, height) == png_size(png)
    assert x0 > 0 and y0 > 0 and x1 < width and y1 < height, (width, height, x0, y0, x1, y1)  # a margin all round
    assert (x1 - x0) / width >= 0.93 and (y1 - y0) / height >= 0.93, (width, height, x0, y0, x1, y1)


def test_matrix_figure_has_a_colour_bar_with_its_scale(open_page: Callable[..., Any], cat: Trace) -> None:
    root = figure_svg(open_page, cat, "matrix", "paper-matrix", layer=1, head=3)
    bar = group(root, "colourbar")
    weights = cat.weights[1, 3]  # [query, key]; the map's own max is full colour (the page's default scale)
    assert by_class(bar, "title") == ["attention weights"]
    top = by_class(bar, "max")[0]
    assert top.endswith("(max)") and float(top.split()[0]) == pytest.approx(float(weights.max()), abs=5e-5)
    assert by_class(bar, "min") == ["0"]
    assert float(bar.get("data-max", "nan")) == pytest.approx(float(weights.max()), rel=1e-6)
    bands = [r.get("fill", "") for r in bar.iter(f"{NS}rect") if r.get("fill") != "none"]
    cells = [r.get("fill", "") for r in group(root, "cells").iter(f"{NS}rect")]
    darkest = min(cells, key=lambda f: sum(rgb(f)))
    assert bands[0] == darkest and bands[-1] == "#ffffff"  # full colour at the top, white at 0
    light = [sum(rgb(f)) for f in bands]
    assert light == sorted(light) and len(set(light)) > 16  # one colour per value, darkest at the max


def test_model_and_effects_figures_have_colour_bars(open_page: Callable[..., Any], cat: Trace) -> None:
    from attnscope.views.effects import grids_html

    model = figure_svg(open_page, cat, "model", "paper-model")
    bar = group(model, "colourbar")
    assert by_class(bar, "max") == ["each map's max"] and by_class(bar, "min") == ["0"]
    grid = cat.weights[:, :, :, 0].mean(axis=-1) - 0.5  # [layer, head], signed
    opened = open_page(grids_html("first-token attention", "m", "test", {"cls": grid}, {"cls": "x"}, cat),
                       "paper-effects")
    svg = opened.page.evaluate("() => window.attnscope.figureSVG(document.getElementById('attnscope-effects-root'))")
    bar = group(parse(svg), "colourbar")
    top = float(np.abs(grid).max())
    assert float(by_class(bar, "max")[0]) == pytest.approx(top, abs=5e-5)
    assert float(by_class(bar, "min")[0]) == pytest.approx(-top, abs=5e-5)
    ends = [rgb(r.get("fill", "")) for r in bar.iter(f"{NS}rect") if r.get("fill") != "none"]
    assert ends[0][2] > ends[0][0] and ends[-1][0] > ends[-1][2]  # blue below zero, orange above


def test_neuron_figure_shows_q_k_their_product_and_the_score(open_page: Callable[..., Any], cat: Trace) -> None:
    layer, head, query = 0, 1, 2
    root = figure_svg(open_page, cat, "neuron", "paper-neuron", layer=layer, head=head, query=query, neuron="all")
    q = cat.arrays["q"][layer, head, query]  # [d_head]
    k = cat.arrays["k"][layer, cat.kv_head(head)]  # [key, d_head]

    def cells(cls: str, key: int | None = None) -> np.ndarray:
        g = group(root, cls, key)
        return np.asarray([float(r.get("data-value", "nan")) for r in g.iter(f"{NS}rect")], dtype=np.float64)

    assert np.array_equal(cells("q"), q.astype(np.float64))  # the trace's float32 numbers, exactly
    for j in range(cat.n_tokens):
        assert np.array_equal(cells("k", j), k[j].astype(np.float64))
        assert np.array_equal(cells("qk", j), (q * k[j]).astype(np.float64))  # elementwise, float32 products
    scores = np.asarray([float(s) for s in by_class(root, "score")])
    assert scores == pytest.approx(cat.arrays["scores"][layer, head, query], abs=5e-5)
    assert scores == pytest.approx((q.astype(np.float64) * k).sum(axis=-1), abs=1e-4)  # q . k = sum of q x k
    scaled = np.asarray([float(s) for s in by_class(root, "scaled")])
    assert scaled == pytest.approx(scores * cat.scaling[layer], abs=1e-4)
    weights = np.asarray([float(s) for s in by_class(root, "weight")])
    assert weights == pytest.approx(cat.weights[layer, head, query], abs=5e-5)
    assert weights == pytest.approx(np.exp(scaled - scaled.max()) / np.exp(scaled - scaled.max()).sum(), abs=5e-4)
    for r in group(root, "q").iter(f"{NS}rect"):  # the colour says the sign: blue below zero, orange above
        red, _, blue = rgb(r.get("fill", ""))
        value = float(r.get("data-value", "0"))
        assert (red > blue) if value > 0.05 else (blue > red) if value < -0.05 else True
    assert len([g for g in root.iter(f"{NS}g") if g.get("class") == "colourbar"]) == 2  # q and k; q x k
    assert "q · k = Σ q × k" in " · ".join(t.text or "" for t in group(root, "caption").iter(f"{NS}text"))


def test_no_caption_leaves_the_caption_out(capsys: pytest.CaptureFixture[str], cat: Trace, tmp_path: Path) -> None:
    kept, dropped = tmp_path / "kept.svg", tmp_path / "dropped.svg"
    assert run(capsys, "view", TEXT, "--view", "matrix", "--layer", "1", "--head", "3", "-o", str(kept))[0] == 0
    code, printed, _ = run(capsys, "view", TEXT, "--view", "matrix", "--layer", "1", "--head", "3", "--no-caption",
                           "-o", str(dropped))
    assert code == 0 and printed.startswith(f"wrote {dropped}: figure of the matrix view")
    with_caption, without = parse(kept.read_text(encoding="utf-8")), parse(dropped.read_text(encoding="utf-8"))
    assert "matrix view" in " ".join(t.text or "" for t in group(with_caption, "caption").iter(f"{NS}text"))
    assert not [g for g in without.iter(f"{NS}g") if g.get("class") == "caption"]
    words = " ".join(t.text or "" for t in without.iter(f"{NS}text"))
    assert "matrix view" not in words and "verified" not in words
    assert len(list(group(without, "cells"))) == len(list(group(with_caption, "cells")))  # the same heatmap
    assert float(without.get("height", "0")) < float(with_caption.get("height", "0"))
    shorter = png_size(figure(cat, tmp_path / "d.png", "head", layer=2, caption=False).read_bytes())
    taller = png_size(figure(cat, tmp_path / "k.png", "head", layer=2).read_bytes())
    assert shorter[1] < taller[1]
    pdf = tmp_path / "d.pdf"
    assert run(capsys, "view", TEXT, "--view", "neuron", "--no-caption", "-o", str(pdf))[0] == 0
    assert pdf_pages(pdf.read_bytes()) == 1
    code, out, err = run(capsys, "view", TEXT, "--no-caption", "-o", str(tmp_path / "page.html"))
    assert code == 2 and out == "" and err.count("\n") == 1 and "--no-caption is for a figure" in err


def test_neuron_figure_of_a_long_text_draws_the_strongest_keys(open_page: Callable[..., Any],
                                                               minilm: attnscope.Model) -> None:
    long = trace("every token of this long sentence attends to the others again " * 12, model=minilm,
                 max_length=128)
    root = figure_svg(open_page, long, "neuron", "paper-neuron-long", layer=0, head=0, query=5, neuron="all")
    drawn = [int(g.get("data-key", "-1")) for g in root.iter(f"{NS}g") if g.get("class") == "k"]
    row = long.weights[0, 0, 5]  # [key]
    assert long.n_tokens == 128 and len(drawn) == 96 and drawn == sorted(drawn)
    assert row[drawn].min() >= np.delete(row, drawn).max()  # the 96 largest weights (ties either way)
    caption = " · ".join(t.text or "" for t in group(root, "caption").iter(f"{NS}text"))
    assert "the 96 keys with the largest weights of 128" in caption


def test_neuron_figure_of_a_causal_grouped_query_model(open_page: Callable[..., Any],
                                                       smollm2: attnscope.Model) -> None:
    """SmolLM2: k from the k/v head the query head reads (grouped-query attention), q and k after RoPE as traced,
    the keys after the query masked (−∞, weight 0)."""
    tr = trace("Hello world,\nhow are you today?", model=smollm2)
    layer, head, query = 3, 4, 5
    root = figure_svg(open_page, tr, "neuron", "paper-neuron-smol", layer=layer, head=head, query=query,
                      neuron=[(layer, head)])
    q, k = tr.arrays["q"][layer, head, query], tr.arrays["k"][layer, tr.kv_head(head)]  # [d_head], [key, d_head]
    assert tr.kv_head(head) != head
    for j in range(tr.n_tokens):
        g = group(root, "qk", j)
        assert np.array_equal([float(r.get("data-value", "nan")) for r in g.iter(f"{NS}rect")], q * k[j])
    scaled, weights = by_class(root, "scaled"), [float(w) for w in by_class(root, "weight")]
    assert scaled[query + 1:] == ["−∞"] * (tr.n_tokens - query - 1) and not any(weights[query + 1:])
    assert [float(s) for s in scaled[: query + 1]] == pytest.approx(
        tr.arrays["scores"][layer, head, query, : query + 1] * tr.scaling[layer], abs=1e-4)
    caption = " · ".join(t.text or "" for t in group(root, "caption").iter(f"{NS}text"))
    assert f"k of k/v head {tr.kv_head(head)}" in caption and "keys after the query masked (−∞)" in caption
