"""Figures of an encoder-decoder page's cross-attention (not square: rows the target tokens, columns the source
tokens) in headless Chromium: every token a <text>, the lines and cells where the trace's weights are, the
kind of attention named in the caption (SVG, and the PNG picture's caption). The CLI's figure: test_seq2seq_cli."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import attnscope
from attnscope.records.trace import EncoderDecoderTrace
from attnscope.stages import ATTENTION_LABELS
from attnscope.views.browser import AS_FIGURE
from tests.support.seq2seq_traces import bart_trace

NS = "{http://www.w3.org/2000/svg}"
ROOT = "document.getElementById('attnscope-root')"
CROSS = ATTENTION_LABELS["cross"]  # "cross-attention (target -> source)"


@pytest.fixture(scope="module")
def ed_trace(minilm: attnscope.Model) -> EncoderDecoderTrace:
    """A random-weight BART: 11 source tokens, 8 target tokens; the decoder 3 layers x 2 heads."""
    return bart_trace(minilm)


def figure(open_page: Callable[..., Any], tr: EncoderDecoderTrace, view: str, **options: Any) -> ET.Element:
    opened = open_page(tr.to_html(view, attention="cross", theme="light", **options), f"ed-fig-{view}")
    svg = opened.page.evaluate(f"() => window.attnscope.figureSVG({ROOT})")
    assert opened.errors == [] and opened.foreign_requests() == []
    root = ET.fromstring(svg.encode("utf-8"))
    assert root.tag == f"{NS}svg" and not list(root.iter(f"{NS}script"))
    return root


def group(root: ET.Element, name: str) -> ET.Element:
    return next(e for e in root.iter(f"{NS}g") if e.get("class") == name)


def texts(root: ET.Element, name: str) -> list[str]:
    return [t.text or "" for t in group(root, name).iter(f"{NS}text")]


def interleaved(rows: list[str], cols: list[str]) -> list[str]:
    """Row i's label then column i's, as the head and matrix figures write them."""
    out = []
    for i in range(max(len(rows), len(cols))):
        out += [f"{i}: {rows[i]}"] if i < len(rows) else []
        out += [f"{i}: {cols[i]}"] if i < len(cols) else []
    return out


def test_head_figure_of_cross_attention(open_page: Callable[..., Any], ed_trace: EncoderDecoderTrace) -> None:
    target, source = ed_trace.decoder.token_strings, ed_trace.encoder.token_strings
    root = figure(open_page, ed_trace, "head", layer=1, show_heads=[0])
    assert texts(root, "tokens") == interleaved(target, source)  # 8 target tokens left, 11 source tokens right
    weights = ed_trace.cross.weights[1, 0]  # [target query, source key]
    assert weights.shape == (len(target), len(source)) and len(target) != len(source)
    lines = list(root.iter(f"{NS}line"))
    drawn = np.zeros_like(weights)
    for line in lines:  # 18 px a row: y1 the query's row on the left, y2 the key's on the right
        q, k = (int(float(line.get(a, "0")) // 18) for a in ("y1", "y2"))
        drawn[q, k] = float(line.get("stroke-opacity", "0"))  # the weight itself (the head view's absolute scale)
    kept = weights >= 0.011  # fainter lines (below 0.01 after the 8-bit code) are left out
    assert kept.sum() > weights.size // 2 and np.abs(drawn[kept] - weights[kept]).max() <= weights.max() / 510 + 5e-4
    assert (drawn[weights < 0.009] == 0).all() and kept.sum() <= len(lines) <= weights.size
    cap = " · ".join(texts(root, "caption"))  # the caption's lines wrap at their " · "
    assert f"head view · {CROSS} · " in cap and f"{len(target)} target × {len(source)} source tokens" in cap


def test_matrix_neuron_and_model_figures_of_cross_attention(open_page: Callable[..., Any],
                                                            ed_trace: EncoderDecoderTrace) -> None:
    target, source = ed_trace.decoder.token_strings, ed_trace.encoder.token_strings
    root = figure(open_page, ed_trace, "matrix", layer=2, head=1)
    assert texts(root, "tokens") == interleaved(target, source)
    frame = next(r for r in root.iter(f"{NS}rect") if r.get("fill") == "none")  # the map's outline
    cell = float(frame.get("width", "0")) / len(source)
    assert float(frame.get("height", "0")) == pytest.approx(cell * len(target), abs=0.02)  # 8 rows x 11 columns
    x0, y0 = float(frame.get("x", "0")), float(frame.get("y", "0"))
    at = {(round((float(r.get("y", "0")) - y0) / cell), round((float(r.get("x", "0")) - x0) / cell))
          for r in group(root, "cells")}
    codes = np.rint(ed_trace.cross.weights[2, 1] / ed_trace.cross.weights[2, 1].max() * 255)  # the page's 8 bits
    assert {(int(q), int(k)) for q, k in zip(*np.nonzero(codes >= 2), strict=True)} <= at
    assert all(0 <= q < len(target) and 0 <= k < len(source) for q, k in at)
    assert f"matrix view · {CROSS} · attention weights · layer 2 · head 1" in " · ".join(texts(root, "caption"))

    neuron = figure(open_page, ed_trace, "neuron", layer=0, head=1, query=3, neuron="all")
    rows = list(group(neuron, "keys").iter(f"{NS}text"))  # per key: its label, q . k, scaled, the weight
    assert [t.text for t in rows if t.get("class") is None] == [f"{i}: {t}" for i, t in enumerate(source)]
    weights = [float(t.text or "nan") for t in rows if t.get("class") == "weight"]  # a row per source token
    assert weights == pytest.approx(ed_trace.cross.weights[0, 1, 3].tolist(), abs=5e-5)
    assert len(list(group(neuron, "k").iter(f"{NS}rect"))) == ed_trace.cross.arrays["k"].shape[-1]  # d_head cells

    model = figure(open_page, ed_trace, "model")
    thumbs = [e for e in model.iter(f"{NS}g") if e.get("class") == "thumb"]
    assert len(thumbs) == ed_trace.cross.n_layers * ed_trace.cross.n_heads
    for t in thumbs:  # every block inside its 64 x 64 square, 11 columns and 8 rows of them
        box = next(r for r in t if r.get("fill") == "none")
        cells = [r for r in t if r.get("fill") != "none"]
        assert [float(r.get("width", "0")) for r in cells] == pytest.approx([64 / len(source)] * len(cells), abs=0.01)
        assert [float(r.get("height", "0")) for r in cells] == pytest.approx([64 / len(target)] * len(cells), abs=0.01)
        assert all(float(r.get("x", "0")) + 64 / len(source) <= float(box.get("x", "0")) + 64.01 for r in cells)


def test_picture_caption_names_the_attention(open_page: Callable[..., Any], ed_trace: EncoderDecoderTrace) -> None:
    opened = open_page(ed_trace.to_html("matrix", attention="cross", layer=1, head=0), "ed-picture")
    opened.page.evaluate(AS_FIGURE)  # what render_png does before its screenshot
    assert opened.page.text_content(".as-figure-caption") == f"{CROSS} · layer 1 · head 0 (0-indexed)"


def test_python_figure_of_one_kind(ed_trace: EncoderDecoderTrace, tmp_path: Any) -> None:
    from attnscope.views.figures import figure as write_figure

    out = write_figure(ed_trace, tmp_path / "decoder.svg", "matrix", attention="decoder", layer=2, head=0)
    root = ET.fromstring(out.read_bytes())
    cap = " · ".join(texts(root, "caption"))  # the caption's lines wrap at their " · "
    assert ATTENTION_LABELS["decoder"] in cap and cap.endswith(f"· {ed_trace.decoder.n_tokens} tokens")
    labels = [f"{i}: {t}" for i, t in enumerate(ed_trace.decoder.token_strings)]
    assert texts(root, "tokens") == [x for label in labels for x in (label, label)]  # square: target x target
