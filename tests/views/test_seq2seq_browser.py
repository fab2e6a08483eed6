"""Encoder-decoder pages in headless Chromium: the encoder / decoder / cross selector in each view, and what is
drawn after it (cross: target tokens as queries, source tokens as keys, the trace's numbers)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import attnscope
from attnscope import numbers
from attnscope.bertviz import head_view
from attnscope.records.trace import EncoderDecoderTrace
from tests.support.seq2seq_traces import bart_trace, t5_trace

KIND = "select.as-attention"
LAYER = 'select[aria-label="layer (0-indexed)"]'
QUERY = 'select[aria-label="query token (0-indexed)"]'
SHOWN = ("([kind, view]) => { const s = document.getElementById('attnscope-root').attnscopeShown;"
         " return s && s.model.payload.attention === kind && s.view() === view"
         " && document.querySelector('.as-panel').childElementCount > 0; }")


@pytest.fixture(scope="module")
def ed_trace(minilm: attnscope.Model) -> EncoderDecoderTrace:
    """A random-weight BART: 11 source tokens, 8 target tokens; 2 encoder layers x 4 heads, 3 decoder layers x 2."""
    return bart_trace(minilm)


@pytest.fixture(scope="module")
def ed_page(ed_trace: EncoderDecoderTrace, open_page: Callable[..., Any]) -> Any:
    return open_page(ed_trace.to_html("all", neuron="all"), "seq2seq-all")


def switch(opened: Any, kind: str, view: str) -> None:
    """Pick a kind in the current view's selector and wait until that kind is drawn in the same view."""
    opened.page.select_option(KIND, kind)
    opened.page.wait_for_function(SHOWN, arg=[kind, view])


def tab(opened: Any, view: str) -> None:
    opened.page.click(f'.as-tab[data-view="{view}"]')
    opened.page.wait_for_selector(f'.as-panel[data-view="{view}"]', state="attached")


def texts(page: Any, selector: str) -> list[str]:
    return list(page.eval_on_selector_all(selector, "ns => ns.map(n => n.textContent)"))


def test_head_view_switches_to_cross(ed_page: Any, ed_trace: EncoderDecoderTrace) -> None:
    page = ed_page.page
    source, target = ed_trace.encoder.token_strings, ed_trace.decoder.token_strings
    assert texts(page, f"{KIND} option") == ["encoder self-attention", "decoder self-attention (causal)",
                                             "cross-attention (target -> source)"]
    assert texts(page, ".as-q .as-tok") == source and texts(page, ".as-k .as-tok") == source
    assert len(texts(page, f"{LAYER} option")) == 2 and len(texts(page, ".as-chip")) == 4
    switch(ed_page, "cross", "head")
    assert texts(page, ".as-q .as-tok") == target and texts(page, ".as-k .as-tok") == source  # target | source
    assert len(texts(page, f"{LAYER} option")) == 3 and len(texts(page, ".as-chip")) == 2
    assert "Left: queries: target (decoder) tokens, right: keys: source (encoder) tokens" in page.inner_text(".as-hint")
    assert [page.get_attribute(c, "aria-label") for c in (".as-q", ".as-k")] == [
        "queries: target (decoder) tokens (from)", "keys: source (encoder) tokens (to)"]
    page.select_option(LAYER, "2")
    page.click(".as-chips .as-link >> text=none")
    page.click('.as-chip[data-head="1"]')
    page.hover('.as-q .as-tok[data-index="2"]')
    page.wait_for_function("() => document.querySelector('.as-q .as-tok.as-focus')")
    shading = page.eval_on_selector_all(".as-k .as-tok", "ts => ts.map(t => Number(t.style.getPropertyValue('--w')))")
    w = ed_trace.cross.weights[2, 1, 2]  # target token 2's weights over the 11 source tokens
    assert len(shading) == 11 and np.abs(np.asarray(shading) - w).max() <= 1 / 510 + 1e-6
    badge = re.fullmatch(r"✓ verified · layer 2, head 1: max error ([0-9.e+-]+) ≤ 1\.0e-05",
                         page.inner_text(".as-panel .as-badge"))  # the cross-attention's own check
    assert badge and float(badge.group(1)) == pytest.approx(ed_trace.cross.check().head_error(2, 1), rel=0.05)
    overall = page.inner_text(".as-header .as-badge")
    assert overall == f"✓ trace verified · max error {numbers.error(ed_trace.cross.check().max_error)}"
    ed_page.shot("seq2seq-head-cross")
    switch(ed_page, "encoder", "head")
    assert texts(page, ".as-q .as-tok") == source
    assert ed_page.errors == [] and ed_page.foreign_requests() == []


def test_matrix_rows_are_targets_and_columns_sources(ed_page: Any, ed_trace: EncoderDecoderTrace) -> None:
    page = ed_page.page
    tab(ed_page, "matrix")
    switch(ed_page, "cross", "matrix")  # the tab stays the matrix
    assert page.inner_text(".as-panel .as-hint").startswith("Rows: queries: target (decoder) tokens, columns: keys: "
                                                            "source (encoder) tokens (0-indexed).")
    page.select_option(LAYER, "1")
    page.click('.as-chip[data-head="0"]')
    cell, label = page.eval_on_selector("canvas.as-matrix", "c => [Number(c.dataset.cell), Number(c.dataset.label)]")
    box = page.query_selector("canvas.as-matrix").bounding_box()
    assert box["width"] == pytest.approx(label + 11 * cell, abs=1) and box["height"] == pytest.approx(label + 8 * cell,
                                                                                                       abs=1)
    page.mouse.move(box["x"] + label + 3.5 * cell, box["y"] + label + 2.5 * cell)  # target 2, source 3
    tip = page.inner_text(".as-tip")
    exact = re.fullmatch(r"attention weights: (\d\.\d{4})", tip.splitlines()[-1])
    assert tip.startswith("query 2: die → key 3: sat") and exact, tip
    assert float(exact.group(1)) == pytest.approx(float(ed_trace.cross.weights[1, 0, 2, 3]), abs=5e-5)
    ed_page.shot("seq2seq-matrix-cross")
    switch(ed_page, "decoder", "matrix")
    box = page.query_selector("canvas.as-matrix").bounding_box()
    cell, label = page.eval_on_selector("canvas.as-matrix", "c => [Number(c.dataset.cell), Number(c.dataset.label)]")
    assert box["width"] == pytest.approx(label + 8 * cell, abs=1) == pytest.approx(box["height"], abs=1)
    assert ed_page.errors == []


def test_model_view_thumbnails_per_kind(ed_page: Any) -> None:
    page = ed_page.page
    tab(ed_page, "model")
    counts = {}
    for kind in ("encoder", "decoder", "cross"):
        switch(ed_page, kind, "model")
        sizes = page.eval_on_selector_all(".as-thumb canvas", "cs => cs.map(c => [c.offsetWidth, c.offsetHeight])")
        counts[kind] = len(sizes)
        ratios = [w / h for w, h in sizes]  # cross: 11 source columns x 8 target rows; self-attention square
        assert ratios == pytest.approx([11 / 8 if kind == "cross" else 1.0] * len(sizes), abs=0.03), (kind, ratios)
    assert counts == {"encoder": 8, "decoder": 6, "cross": 6}  # layers x heads of each
    ed_page.shot("seq2seq-model-cross")
    page.click('.as-thumb[data-layer="2"][data-head="1"]')  # opened large: the cross matrix and head view
    page.click('dialog[open] [data-show="head"]')
    assert len(texts(page, "dialog[open] .as-q .as-tok")) == 8 and len(texts(page, "dialog[open] .as-k .as-tok")) == 11
    page.keyboard.press("Escape")
    page.wait_for_selector("dialog", state="detached", timeout=5000)
    assert ed_page.errors == []


def test_neuron_view_q_from_the_decoder_k_from_the_encoder(ed_page: Any, ed_trace: EncoderDecoderTrace) -> None:
    page = ed_page.page
    tab(ed_page, "neuron")
    switch(ed_page, "cross", "neuron")
    page.select_option(LAYER, "2")
    page.click('.as-chip[data-head="1"]')
    page.select_option(QUERY, "3")
    page.wait_for_function("() => document.querySelector('.as-query-tok').textContent === '3: katz'")
    values = "ns => ns.map(n => n.dataset.value)"
    weights = page.eval_on_selector_all('.as-neuron-scores [data-stage="weights"]', values)
    scores = page.eval_on_selector_all('.as-neuron-scores [data-stage="scores"]', values)
    cross = ed_trace.cross
    assert np.array_equal(np.float32(weights), cross.weights[2, 1, 3])  # the trace's float32, bit for bit
    assert np.array_equal(np.float32(scores), cross.arrays["scores"][2, 1, 3])
    keys = texts(page, ".as-neuron-scores .as-tok-cell:not(.as-query-tok)")
    assert keys == [f"{i}: {t}" for i, t in enumerate(ed_trace.encoder.token_strings)]
    assert "q comes from the decoder" in page.inner_text(".as-modern")
    assert "masked" not in page.inner_text(".as-neuron-scores")  # every target token sees every source token
    ed_page.shot("seq2seq-neuron-cross")
    assert ed_page.errors == []


def test_hostile_tokens_in_a_drop_in_cross_view(ed_trace: EncoderDecoderTrace, open_page: Callable[..., Any]) -> None:
    evil = ["</script><img src=x onerror=window.pwned=1>", '"><svg onload=window.pwned=2>']
    enc = ed_trace.encoder.token_strings[:-2] + evil
    cross = [ed_trace.cross.weights[i][None] for i in range(3)]  # bertviz's tuple of (1, heads, target, source)
    page = head_view(cross_attention=cross, encoder_tokens=enc, decoder_tokens=ed_trace.decoder.token_strings,
                     html_action="return")
    opened = open_page(page.data, "seq2seq-hostile")  # type: ignore[union-attr]
    assert texts(opened.page, ".as-k .as-tok")[-2:] == evil
    assert opened.page.query_selector(KIND) is not None  # one kind given: still named
    opened.page.hover('.as-q .as-tok[data-index="1"]')
    assert opened.page.evaluate("() => [window.pwned, document.querySelectorAll('img, svg').length]") == [None, 0]
    assert opened.dialogs == [] and opened.errors == [] and opened.foreign_requests() == []


def test_t5_neuron_view_adds_the_position_bias(minilm: attnscope.Model, open_page: Callable[..., Any]) -> None:
    """The page's own numbers explain T5's weights: softmax(q . k x 1 + position bias) is the weight row."""
    ed = t5_trace(minilm)
    opened = open_page(ed.to_html("neuron", layer=1, head=3, query=4), "seq2seq-t5-neuron")
    page = opened.page
    values = "ns => ns.map(n => Number(n.dataset.value))"
    shown = {stage: np.asarray(page.eval_on_selector_all(f'.as-neuron-scores [data-stage="{stage}"]', values))
             for stage in ("scaled", "position_bias", "weights")}
    enc = ed.encoder
    assert np.array_equal(np.float32(shown["position_bias"]), enc.arrays["position_bias"][1, 3, 4])
    logits = shown["scaled"] + shown["position_bias"]
    softmax = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    assert np.abs(softmax - shown["weights"]).max() <= 1e-5  # float32 numbers, float64 softmax
    assert "+ position bias" in texts(page, ".as-neuron-scores .as-th")
    assert "relative position bias" in page.inner_text(".as-scaling")
    switch(opened, "cross", "neuron")
    assert page.query_selector('.as-neuron-scores [data-stage="position_bias"]') is None  # cross: no bias in T5
    assert opened.errors == [] and opened.foreign_requests() == []
