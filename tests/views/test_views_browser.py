"""The views in real headless Chromium: controls, hover, numbers against the trace, keyboard, themes, escaping."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import attnscope
from attnscope.bertviz import head_view
from attnscope.tracing.one_pass import Trace, trace
from attnscope.views import bundle, neuron_block, payload, to_html
from attnscope.views.page import json_for_script
from tests.support.views import NEXT_FRAME

LAYER = 'select[aria-label="layer (0-indexed)"]'
QUERY = 'select[aria-label="query token (0-indexed)"]'
LISTEN = ("() => { window.picked = [];"
          " document.addEventListener('attnscope:select', e => window.picked.push(e.detail)); }")


@pytest.fixture(scope="module")
def all_page(pair_trace: Trace, open_page: Callable[..., Any]) -> Any:
    opened = open_page(to_html(pair_trace, "all"), "all")
    opened.page.evaluate(LISTEN)
    return opened


def tab(opened: Any, view: str) -> None:
    opened.page.click(f'.as-tab[data-view="{view}"]')
    opened.page.wait_for_selector(f'.as-panel[data-view="{view}"]', state="attached")


def canvas_picture(page: Any, selector: str) -> str:
    return str(page.eval_on_selector(selector, "c => c.toDataURL()"))


def test_page_loads_offline_from_a_file(all_page: Any) -> None:
    assert all_page.url.startswith("file://")
    assert all_page.page.eval_on_selector_all(".as-tab", "ts => ts.map(t => t.textContent)") == [
        "Head", "Model", "Matrix", "Neuron"]
    all_page.shot("all-head-light")
    assert all_page.foreign_requests() == [] and all_page.errors == []


def test_head_view_layer_heads_and_hover(all_page: Any, pair_trace: Trace) -> None:
    page = all_page.page
    tab(all_page, "head")
    page.select_option(LAYER, "3")
    page.click(".as-chips .as-link >> text=none")
    page.click('.as-chip[data-head="5"]')
    pressed = page.eval_on_selector_all(".as-chip", "cs => cs.map(c => c.getAttribute('aria-pressed'))")
    assert pressed == ["false"] * 5 + ["true"] + ["false"] * 6
    before = canvas_picture(page, "canvas.as-lines")
    page.hover('.as-q .as-tok[data-index="2"]')
    page.wait_for_function("() => document.querySelector('.as-q .as-tok.as-focus')")
    assert canvas_picture(page, "canvas.as-lines") != before  # only the hovered token's lines remain
    shading = page.eval_on_selector_all(".as-k .as-tok", "ts => ts.map(t => Number(t.style.getPropertyValue('--w')))")
    w = pair_trace.weights[3, 5, 2]
    assert np.abs(np.asarray(shading) - w).max() <= w.max() / 510 + 1e-6  # shading is the trace's weight row
    all_page.shot("head-hover")
    page.click('.as-q .as-tok[data-index="2"]')
    assert page.evaluate("() => window.picked.at(-1)") == {
        "view": "head", "layer": 3, "head": 5, "query": 2, "key": None, "source": "weights"}
    assert all_page.errors == []


def test_sentence_filter_for_pairs(all_page: Any) -> None:
    page = all_page.page
    tab(all_page, "head")
    select = 'select[aria-label="sentence filter (query → key)"]'
    assert page.eval_on_selector_all(f"{select} option", "os => os.map(o => o.textContent)") == [
        "all", "A → A", "A → B", "B → A", "B → B"]
    page.mouse.move(0, 0)
    pictures = set()
    for value in ("all", "AB", "BA"):
        page.select_option(select, value)
        page.evaluate(NEXT_FRAME)
        pictures.add(canvas_picture(page, "canvas.as-lines"))
    assert len(pictures) == 3


def test_model_view_thumbnails_open_large(all_page: Any) -> None:
    page = all_page.page
    tab(all_page, "model")
    assert page.eval_on_selector_all(".as-thumb", "ts => ts.length") == 72
    all_page.shot("model")
    page.click('.as-thumb[data-layer="4"][data-head="7"]')
    assert page.inner_text("dialog[open] .as-dialog-head strong") == "layer 4 · head 7 · attention weights"
    assert page.is_visible("dialog[open] canvas.as-matrix")
    page.click('dialog[open] [data-show="head"]')
    assert page.eval_on_selector_all("dialog[open] .as-q .as-tok", "ts => ts.length") == 14
    all_page.shot("model-dialog")
    page.keyboard.press("Escape")
    page.wait_for_selector("dialog", state="detached", timeout=5000)  # "close" is a queued event, not synchronous


def test_matrix_view_values_on_hover_and_select(all_page: Any, pair_trace: Trace) -> None:
    page = all_page.page
    tab(all_page, "matrix")
    page.select_option(LAYER, "1")
    page.click('.as-chip[data-head="2"]')
    cell, label = page.eval_on_selector("canvas.as-matrix", "c => [Number(c.dataset.cell), Number(c.dataset.label)]")
    box = page.query_selector("canvas.as-matrix").bounding_box()
    page.mouse.move(box["x"] + label + 4.5 * cell, box["y"] + label + 3.5 * cell)  # query 3, key 4
    tip = page.inner_text(".as-tip")
    w = float(pair_trace.weights[1, 2, 3, 4])
    exact = re.fullmatch(r"attention weights: (\d\.\d{4})", tip.splitlines()[-1])
    assert tip.startswith("query 3: sat → key 4: on") and exact and "≈" not in tip, tip
    assert float(exact.group(1)) == pytest.approx(w, abs=5e-5)  # the exact float32, in the one 4-decimal format
    all_page.shot("matrix-hover")
    page.mouse.click(box["x"] + label + 4.5 * cell, box["y"] + label + 3.5 * cell)
    assert page.evaluate("() => window.picked.at(-1)") == {
        "view": "matrix", "layer": 1, "head": 2, "query": 3, "key": 4, "source": "weights"}
    page.click(".as-info .as-link")  # "neuron view of query 3 →"
    page.wait_for_selector('.as-panel[data-view="neuron"] [data-stage="weights"]')
    assert page.input_value(QUERY) == "3" and page.input_value(LAYER) == "1"


def neuron_rows(page: Any) -> dict[str, list[float]]:
    cells = page.eval_on_selector_all(".as-neuron-scores .as-neuron [data-stage]",
                                      "ns => ns.map(n => [n.dataset.stage, n.dataset.value])")
    out: dict[str, list[float]] = {}
    for stage, value in cells:
        out.setdefault(stage, []).append(float(value))
    return out


def test_neuron_view_shows_the_trace_numbers(all_page: Any, pair_trace: Trace) -> None:
    page = all_page.page
    tab(all_page, "neuron")
    page.select_option(LAYER, "2")
    page.click('.as-chip[data-head="5"]')
    page.select_option(QUERY, "6")
    page.wait_for_function("() => document.querySelector('.as-query-tok').textContent.startsWith('6:')")
    rows = neuron_rows(page)
    scores = pair_trace.arrays["scores"][2, 5, 6]
    assert np.array_equal(np.float32(rows["scores"]), scores)  # bit for bit: the page shows the trace's float32
    assert np.array_equal(np.float32(rows["weights"]), pair_trace.weights[2, 5, 6])
    assert np.array_equal(np.float32(rows["scaled"]), scores * np.float32(pair_trace.scaling[2]))
    shown = page.eval_on_selector_all('.as-neuron-scores [data-stage="weights"]', "ns => ns.map(n => n.textContent)")
    assert all(re.fullmatch(r"\d\.\d{4}", s) for s in shown)  # one format: 4 decimals
    assert [float(s) for s in shown] == pytest.approx(pair_trace.weights[2, 5, 6], abs=5e-5)
    q, k = pair_trace.arrays["q"][2, 5, 6], pair_trace.arrays["k"][2, 5]
    vec = page.query_selector_all("canvas.as-vec")[2]  # q, k, then q × k
    box = vec.bounding_box()
    cw = box["width"] / q.size
    page.mouse.move(box["x"] + 7.5 * cw, box["y"] + 4.5 * 22)  # key 4, dimension 7
    tip = page.inner_text(".as-tip")
    assert tip.startswith("key 4: on") and "q[7] × k[7] = " in tip
    assert float(tip.split("= ")[1]) == pytest.approx(float(q[7] * k[4, 7]), rel=5e-6)
    badge = re.fullmatch(r"✓ verified · layer 2, head 5: max error ([0-9.e+-]+) ≤ 1\.0e-05",
                         page.inner_text(".as-panel .as-badge"))
    assert badge and float(badge.group(1)) == pytest.approx(pair_trace.check().head_error(2, 5), rel=0.05)
    all_page.shot("neuron")
    assert all_page.errors == []


def test_causal_model_masks_later_keys(tiny_model: Callable[[str], attnscope.Model],
                                       open_page: Callable[..., Any]) -> None:
    tr = trace("the cat sat on the mat", model=tiny_model("gpt2"))
    opened = open_page(to_html(tr, "neuron", query=3), "gpt2-neuron")
    rows = neuron_rows(opened.page)
    assert rows["scaled"][4:] == [float("-inf")] * (tr.n_tokens - 4) and not any(rows["weights"][4:])
    expected = tr.arrays["scores"][0, 0, 3, :4] * np.float32(tr.scaling[0])
    assert np.array_equal(np.float32(rows["scaled"][:4]), expected)
    assert opened.page.query_selector(".as-tab") is None  # a single view has no tabs
    assert opened.errors == [] and opened.foreign_requests() == []


def test_keyboard_reaches_every_control(all_page: Any) -> None:
    page = all_page.page
    tab(all_page, "head")
    page.focus('.as-tab[data-view="head"]')
    page.keyboard.press("ArrowRight")
    assert page.get_attribute('.as-tab[data-view="model"]', "aria-selected") == "true"
    page.keyboard.press("ArrowLeft")
    reached = set()
    for _ in range(40):
        page.keyboard.press("Tab")
        reached.add(page.evaluate("() => { const a = document.activeElement;"
                                  " return a.getAttribute('aria-label') || a.className; }"))
    assert {"layer (0-indexed)", "as-chip", "query tokens (from)", "switch light or dark theme"} <= reached
    page.focus(".as-q")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")
    assert page.evaluate("() => window.picked.at(-1).query") == 1


def test_light_and_dark_themes(pair_trace: Trace, open_page: Callable[..., Any]) -> None:
    opened = open_page(to_html(pair_trace, "matrix"), "theme", color_scheme="dark")
    page = opened.page
    background = "() => getComputedStyle(document.querySelector('.as-app')).backgroundColor"
    assert page.get_attribute(".as-app", "data-theme") == "dark" and page.evaluate(background) == "rgb(18, 21, 27)"
    dark = canvas_picture(page, "canvas.as-matrix")
    opened.shot("matrix-dark")
    page.click(".as-theme")
    assert page.get_attribute(".as-app", "data-theme") == "light" and page.evaluate(background) == "rgb(255, 255, 255)"
    assert canvas_picture(page, "canvas.as-matrix") != dark  # the heatmap is redrawn in the light colours
    opened.shot("matrix-light")
    assert opened.errors == []


HOSTILE_TOKENS = ["[CLS]", "</script><img src=x onerror=window.pwned=1>", '"><svg onload=window.pwned=2>',
                  "<b>bold</b>", "</script><img src=x onerror=alert(1)>", '"><svg onload=alert(1)>', "[SEP]"]


def test_hostile_tokens_render_literally(open_page: Callable[..., Any]) -> None:
    n = len(HOSTILE_TOKENS)
    attention = [torch.softmax(torch.randn(1, 2, n, n, generator=torch.Generator().manual_seed(1)), -1)]
    page = head_view(attention, HOSTILE_TOKENS, html_action="return")
    opened = open_page(page.data, "hostile")  # type: ignore[union-attr]
    shown = opened.page.eval_on_selector_all(".as-q .as-tok", "ts => ts.map(t => t.textContent)")
    assert shown == HOSTILE_TOKENS
    opened.page.hover('.as-q .as-tok[data-index="1"]')
    assert opened.page.evaluate("() => [window.pwned, document.querySelectorAll('img, svg, b').length]") == [None, 0]
    assert opened.dialogs == [] and opened.errors == [] and opened.foreign_requests() == []
    assert opened.page.inner_text(".as-badge") == "NOT VERIFIED: weights passed in directly, without their model: " \
        "nothing to verify them against"
    opened.shot("hostile-tokens")


def test_hostile_text_through_the_tokenizer(minilm: attnscope.Model, open_page: Callable[..., Any]) -> None:
    text = 'a </script><img src=x onerror=alert(1)> b'
    pair = '"><svg onload=alert(1)>'
    opened = open_page(to_html(trace(text, pair, model=minilm), "all"), "hostile-text")
    assert opened.page.text_content(".as-title") == f"{text}  ‖  {pair}"
    assert opened.page.evaluate("() => document.querySelectorAll('img, svg').length") == 0
    assert opened.dialogs == [] and opened.errors == [] and opened.foreign_requests() == []


def test_512_tokens_stay_usable(minilm: attnscope.Model, open_page: Callable[..., Any]) -> None:
    sentence = "attention heads read every token of this long and repetitive sentence again "
    tr = trace(sentence * 60, model=minilm, max_length=512)
    assert tr.n_tokens == 512
    opened = open_page(to_html(tr, "all"), "long")
    page = opened.page
    assert page.eval_on_selector("canvas.as-lines", "c => c.clientHeight") <= 900  # only the visible band is drawn
    page.eval_on_selector(".as-head-body", "b => b.scrollTop = b.scrollHeight")
    page.hover('.as-q .as-tok[data-index="510"]')
    page.wait_for_function("() => document.querySelector('.as-q .as-tok.as-focus')?.dataset.index === '510'")
    opened.shot("long-head")
    tab(opened, "model")
    assert page.eval_on_selector_all(".as-thumb", "ts => ts.length") == 72
    tab(opened, "neuron")
    assert len(neuron_rows(page)["weights"]) == 512
    assert opened.errors == [] and opened.foreign_requests() == []


def test_another_page_embeds_the_views(pair_trace: Trace, open_page: Callable[..., Any]) -> None:
    """The web app's contract: bundle() in its page, render(element, payload, options), lazy neuron blocks, events."""
    data = payload(pair_trace, neuron="none")
    blocks = {f"{layer}:{head}": neuron_block(pair_trace, layer, head) for layer, head in ((3, 1), (3, 2))}
    host = (f"<!doctype html><meta charset=utf-8><title>host</title>{bundle()}"
            "<main><div id=attnscope-root></div></main>"
            f"<script>window.asked = []; const blocks = {json_for_script(blocks)};"
            f"window.events = []; document.addEventListener('attnscope:select', e => window.events.push(e.detail));"
            f"window.ctl = attnscope.render(document.getElementById('attnscope-root'), {json_for_script(data)},"
            "{view: 'neuron', layer: 3, head: 1, query: 4, theme: 'dark', loadNeuron: (l, h) => {"
            " window.asked.push([l, h]); return Promise.resolve(blocks[l + ':' + h]); }});</script>")
    opened = open_page(host, "embedded")
    page = opened.page
    page.wait_for_selector('[data-stage="weights"]')
    assert np.array_equal(np.float32(neuron_rows(page)["weights"]), pair_trace.weights[3, 1, 4])
    page.evaluate("async () => (await window.ctl).set({head: 2})")
    page.wait_for_function("() => window.asked.length === 2")
    page.wait_for_function("() => document.querySelector('.as-chip[aria-pressed=true]').dataset.head === '2'")
    page.wait_for_selector('[data-stage="weights"]')
    assert np.array_equal(np.float32(neuron_rows(page)["weights"]), pair_trace.weights[3, 2, 4])
    page.click('.as-tok-cell[data-key="7"]')
    assert page.evaluate("() => [window.asked, window.events.at(-1)]") == [[[3, 1], [3, 2]], {
        "view": "neuron", "layer": 3, "head": 2, "query": 4, "key": 7, "source": "weights"}]
    assert page.get_attribute(".as-app", "data-theme") == "dark" and opened.errors == []


def test_unverified_family_and_causal_mask(tiny_model: Callable[[str], attnscope.Model],
                                           open_page: Callable[..., Any]) -> None:
    tr = trace("the cat sat on the mat", model=tiny_model("starcoder2"))  # no attnscope adapter
    opened = open_page(to_html(tr, "matrix", layer=1, head=2), "starcoder2-matrix")
    page = opened.page
    badges = page.eval_on_selector_all(".as-badge", "bs => bs.map(b => b.textContent)")
    assert badges == [f"NOT VERIFIED: {tr.unsupported}"] * 2 and "starcoder2" in str(tr.unsupported)  # never "verified"
    page.focus("canvas.as-matrix")
    for key in ("ArrowRight", "ArrowRight", "ArrowDown"):  # query 1, key 2: a later key
        page.keyboard.press(key)
    assert page.inner_text(".as-tip").splitlines()[1] == "masked: a causal model's query never sees later keys"
    page.keyboard.press("ArrowLeft")  # key 1: seen
    assert "≈" in page.inner_text(".as-tip") and tr.causal
    opened.shot("starcoder2-matrix-causal")
    assert opened.errors == []


def test_a_causal_models_rollout_says_why_it_piles_up_on_token_0(smollm2: attnscope.Model,
                                                                   minilm: attnscope.Model,
                                                                   open_page: Callable[..., Any]) -> None:
    """SmolLM2's rollout puts ~100% on token 0 in its top layers. The source switch says why, for rollout in a
    causal model only (as `attnscope rollout` does)."""
    tr = trace("The cat sat on the mat", model=smollm2)
    tr.rollout()  # computed: the views' source switch offers it
    assert tr.rollout()[-1, -1, 0] > 0.99 and tr.causal
    opened = open_page(to_html(tr, "matrix", layer=29, head=0), "smollm2-matrix-rollout")
    page = opened.page
    note = ".as-source-note"
    assert page.query_selector(note) is not None and page.is_hidden(note)  # raw weights first
    page.select_option('select[aria-label="what to draw"]', "rollout")
    assert page.is_visible(note) and page.inner_text(note) == (
        "causal model: position 0 reads only itself, so rollout piles up on token 0 in later layers")
    opened.shot("smollm2-matrix-rollout")
    page.select_option('select[aria-label="what to draw"]', "weights")
    assert page.is_hidden(note) and opened.errors == [] and opened.foreign_requests() == []
    bert = trace("The cat sat on the mat", model=minilm)
    bert.rollout()
    other = open_page(to_html(bert, "matrix"), "minilm-matrix-rollout")
    other.page.select_option('select[aria-label="what to draw"]', "rollout")
    assert other.page.query_selector(note) is not None and other.page.is_hidden(note)  # reads both ways: no pile-up
    assert other.errors == []
