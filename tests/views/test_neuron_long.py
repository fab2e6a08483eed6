"""The neuron view past 1,024 keys (issue 29, the long-context Neuron tab): Chromium leaves a canvas taller than
32,767 px blank (2,048 keys x 22 px is 45,056), so each vector column is a stack of canvases of at most 1,024 rows,
coloured on one scale, whose hover names the right key; the key rows come in chunks the browser lays out only
near the screen, aligned under the headers. A random-weight Llama (RoPE, 2,048 positions) on 1,100 tokens, drawn from
a self-contained page."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import attnscope
from attnscope.tracing.one_pass import trace
from attnscope.views import to_html

KEYS = 1100


@pytest.fixture(scope="module")
def opened(tiny_model: Callable[[str], attnscope.Model], open_page: Callable[..., Any]) -> Any:
    text = " ".join(["the keeper counted waves"] * (KEYS // 4 + 10))
    tr = trace(text, model=tiny_model("llama"), max_length=KEYS)
    assert tr.n_tokens == KEYS
    o = open_page(to_html(tr, "neuron", layer=1, head=2, query=KEYS - 1), "neuron-long", width=1280)
    o.page.wait_for_selector(".as-neuron .as-vec-stack", timeout=120_000)
    return o


def test_long_vector_columns_are_stacks_of_drawn_canvases(opened: Any) -> None:
    page = opened.page
    stacks = page.eval_on_selector_all(".as-neuron-parts .as-vec-stack", """ss => ss.map((s) => [...s.children]
      .map((c) => { const g = c.getContext("2d"); const d = g.getImageData(0, 0, c.width, c.height).data;
        let coloured = 0; for (let i = 0; i < d.length; i += 4) coloured += d[i] !== 255 || d[i + 1] !== 255 ||
          d[i + 2] !== 255 ? 1 : 0;
        return [c.tagName, parseFloat(c.style.height), coloured]; }))""")
    assert len(stacks) == 4  # k, q x k; v, weight x v
    for stack in stacks:
        assert [(tag, height) for tag, height, _ in stack] == [("CANVAS", 1024 * 22), ("CANVAS", (KEYS - 1024) * 22)]
        assert all(coloured > 0 for _, _, coloured in stack)  # the rows past 1,024 are drawn, not blank
    assert opened.errors == []


def test_hover_on_the_second_canvas_names_its_key(opened: Any) -> None:
    page = opened.page
    second = page.query_selector_all(".as-neuron-scores .as-vec-stack")[0].query_selector_all("canvas")[1]
    box = second.bounding_box()
    second.scroll_into_view_if_needed()
    box = second.bounding_box()
    page.mouse.move(box["x"] + 2, box["y"] + (1050 - 1024 + 0.5) * 22)  # key 1,050 (keys in position order)
    tip = page.inner_text(".as-tip")
    assert tip.startswith("key 1050"), tip


def test_key_rows_come_in_chunks_aligned_with_the_headers(opened: Any) -> None:
    """The key rows are chunks of 32, each laid out only near the screen (content-visibility: auto), every cell in the
    page in key order; a chunk far down, once scrolled to, has its columns exactly under the headers and its text
    unclipped."""
    page = opened.page
    chunks = page.eval_on_selector_all(".as-neuron-scores .as-key-rows",
                                       "cs => cs.map((c) => getComputedStyle(c).contentVisibility)")
    assert len(chunks) == 2 * -(-KEYS // 32)  # the labels' and the numbers' chunk of each 32 rows
    assert set(chunks) == {"auto"}
    keys = page.eval_on_selector_all(".as-neuron-scores [data-stage='weights']", "ns => ns.map((n) => n.dataset.key)")
    assert keys == [str(j) for j in range(KEYS)]
    far = page.query_selector_all(".as-neuron-scores .as-key-rows")[2 * 30 + 1]  # the numbers of keys 960-991
    far.scroll_into_view_if_needed()
    page.wait_for_timeout(100)
    lefts = page.evaluate("""() => {
      const left = (n) => Math.round(n.getBoundingClientRect().left);
      const heads = [...document.querySelectorAll(".as-neuron-scores .as-th")];
      const head = (t) => left(heads.find((h) => h.textContent === t));
      const cell = (s) => left(document.querySelector(`.as-neuron-scores [data-stage='${s}'][data-key='970']`));
      const label = document.querySelector(".as-neuron-scores .as-tok-cell[data-key='970']");
      return { heads: [head("key"), head("q · k"), head("scaled")],
               cells: [left(label), cell("scores"), cell("scaled")],
               clipped: [...document.querySelectorAll(".as-neuron-scores [data-key='970']")]
                 .filter((n) => n.scrollWidth > n.clientWidth + 1).length };
    }""")
    assert lefts["heads"] == lefts["cells"] and lefts["clipped"] == 0, lefts
    assert opened.errors == []


def test_the_rows_past_the_first_screen_come_in_after_it(opened: Any) -> None:
    """The view is drawn (its attnscope:drawn) with its first 128 key rows built; the others come in slices just
    after, until the body says data-rows="all": then every key is there once, in key order. A query chosen while the
    rows of another still come in stops those (its own are the ones there)."""
    got = opened.page.evaluate("""async () => {
      const root = document.getElementById("attnscope-root");
      const body = () => root.querySelector(".as-neuron-body");
      const keys = () => [...root.querySelectorAll(".as-neuron-scores [data-stage='weights']")]
        .map((n) => n.dataset.key);
      const atDrawn = [];
      root.addEventListener("attnscope:drawn",
                            (e) => atDrawn.push([e.detail.query, body().dataset.rows, keys().length]));
      root.attnscopeShown.set({ query: 5 });
      await new Promise((r) => setTimeout(r, 0));
      root.attnscopeShown.set({ query: 7 });  // while query 5's rows come in
      while (body().dataset.rows !== "all") await new Promise((r) => setTimeout(r, 20));
      const shown = root.querySelector(".as-query-tok").textContent;
      const all = keys();
      root.attnscopeShown.set({ query: ${KEYS - 1} });  // as the module's other tests found it
      while (body().dataset.rows !== "all") await new Promise((r) => setTimeout(r, 20));
      return { atDrawn: atDrawn.slice(0, 2), shown: shown, keys: all };
    }""".replace("${KEYS - 1}", str(KEYS - 1)))
    assert got["atDrawn"] == [[5, "some", 128], [7, "some", 128]]
    assert got["shown"].startswith("7") and got["keys"] == [str(j) for j in range(KEYS)]
    assert opened.errors == []
