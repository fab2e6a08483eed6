"""The neuron view's vector canvases (issue 29, the long-context Neuron tab): one pixel per cell, shown cw x 22 times
larger without smoothing through a mask that leaves the gaps out (a rectangle per cell cost seconds at 2,048 keys).
Each pixel is the colour the view's scale gives that cell's number: the trace's own q and k (and v) of the head,
checked against numpy here with the colour formula written out again; the colour bytes equal A.diverging's. A
causal model's masked keys are muted. MiniLM (q, k, v) and a random-weight GPT-2 (causal), self-contained pages."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import attnscope
from attnscope.tracing.one_pass import trace
from attnscope.views import to_html

TEXT = "The keeper counted the waves that broke over the harbour wall before dawn."
PIXELS = """(c) => { const g = c.getContext("2d"); return [c.width, c.height, c.style.width, c.style.height,
  c.style.imageRendering, Array.from(g.getImageData(0, 0, c.width, c.height).data)]; }"""


def colours(values: np.ndarray, theme: str = "light") -> np.ndarray:
    """data.js's A.diverging as numbers: the base colour towards blue (below 0) or orange by |v| / max |v|."""
    top = float(np.abs(values).max())
    t = np.minimum(1.0, np.abs(values.astype(np.float64)) / top) if top > 0 else np.zeros(values.shape)
    base = np.array([24, 27, 34] if theme == "dark" else [255, 255, 255], dtype=np.float64)
    end = np.where(values[..., None] < 0, [33, 102, 172], [230, 97, 1])
    return np.floor(base + (end - base) * t[..., None] + 0.5).astype(np.uint8)  # Math.round: halves up


@pytest.fixture(scope="module")
def opened(open_page: Callable[..., Any]) -> Any:
    tr = trace(TEXT)
    return tr, open_page(to_html(tr, "neuron", layer=2, head=3, query=5), "neuron-canvas")


def test_each_pixel_is_its_cells_colour(opened: Any) -> None:
    tr, o = opened
    canvases = o.page.query_selector_all(".as-neuron-parts canvas.as-vec")  # q, k, q x k; v, weight x v, context
    q, k, v = (tr.arrays[s][2, 3] for s in ("q", "k", "v"))  # [token, d_head]
    d = k.shape[1]
    want = {0: q[5][None], 1: k, 2: q[5][None] * k, 3: v}  # q x k: float32 products, as the page's Math.fround
    for i, values in want.items():
        width, height, css_w, css_h, rendering, data = canvases[i].evaluate(PIXELS)
        assert (width, height) == (d, values.shape[0]) and rendering == "pixelated"
        cw = float(css_w.removesuffix("px")) / d
        assert cw == int(cw) and float(css_h.removesuffix("px")) == values.shape[0] * 22
        rgba = np.asarray(data, dtype=np.uint8).reshape(height, width, 4)
        assert (rgba[..., 3] == 255).all()
        np.testing.assert_array_equal(rgba[..., :3], colours(values.astype(np.float32)), err_msg=str(i))
    assert o.errors == []


def test_the_colour_bytes_are_a_diverging(opened: Any) -> None:
    _, o = opened
    same = o.page.evaluate("""() => { const A = window.attnscope; const out = [];
      for (const theme of ["light", "dark"]) for (const max of [0, 1e-30, 0.5, 3]) for (let i = -40; i <= 40; i++) {
        const v = i * 0.0837;
        const c = new Uint8ClampedArray(4);
        A.divergingInto(c, 0, v, max, theme);  // the bytes a canvas is filled with
        if (`rgb(${c[0]},${c[1]},${c[2]})` !== A.diverging(v, max, theme)) out.push([v, max, theme]);
      } return out; }""")
    assert same == []


def test_masked_keys_are_muted(tiny_model: Callable[[str], attnscope.Model], open_page: Callable[..., Any]) -> None:
    tr = trace("the cat sat on the mat", model=tiny_model("gpt2"))
    o = open_page(to_html(tr, "neuron", query=3), "neuron-masked")
    cells = o.page.eval_on_selector_all(".as-neuron-scores .as-tok-cell[data-key]",
                                        "ns => ns.map(n => [Number(n.dataset.key), 'masked' in n.dataset, "
                                        "getComputedStyle(n).color])")
    assert [(key, masked) for key, masked, _ in cells] == [(j, j > 3) for j in range(tr.n_tokens)]
    muted = {colour for _, masked, colour in cells if masked}
    plain = {colour for _, masked, colour in cells if not masked}
    assert len(muted) == 1 and muted.isdisjoint(plain)
    assert o.errors == []


def test_a_picture_of_the_page_draws_every_key_row(tiny_model: Callable[[str], attnscope.Model],
                                                   open_page: Callable[..., Any]) -> None:
    """`attnscope view -o FILE.png` screenshots the whole page (views.browser.render_png, after AS_FIGURE): there
    every chunk of key rows is drawn, not only those near the screen (content-visibility: auto would leave the rows
    past the first screen blank)."""
    from io import BytesIO

    from PIL import Image

    from attnscope.views.browser import AS_FIGURE

    tr = trace(" ".join([TEXT] * 8), model=tiny_model("gpt2"))
    o = open_page(to_html(tr, "neuron", query=3), "neuron-picture", width=1280)
    page = o.page
    page.evaluate(AS_FIGURE, True)
    assert set(page.eval_on_selector_all(".as-key-rows", "cs => cs.map((c) => getComputedStyle(c).contentVisibility)"))\
        == {"visible"}
    shot = np.asarray(Image.open(BytesIO(page.screenshot(full_page=True))).convert("L"))
    for key in (tr.n_tokens - 40, tr.n_tokens - 1):  # rows several screens down, labels and weights
        for cell in page.query_selector_all(f".as-neuron-scores [data-key='{key}']"):
            left, top, width, height = cell.evaluate("""(n) => { const b = n.getBoundingClientRect();
              return [b.left + scrollX, b.top + scrollY, b.width, b.height]; }""")
            assert top > 2 * 900  # past the first screens
            box = shot[int(top):int(top + height), int(left):int(left + width)]
            assert (box < 128).any(), (key, cell.get_attribute("data-stage"))  # its text is drawn
    assert o.errors == []
