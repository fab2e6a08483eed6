"""The page as text: one JSON block that cannot break out, a script pinned by hash, nothing to fetch."""

from __future__ import annotations

import base64
import hashlib
import html
import re
from pathlib import Path

import pytest

import attnscope
from attnscope.errors import AttnscopeError
from attnscope.tracing.one_pass import Trace, trace
from attnscope.views import HTMLPage, bundle, css, js, repr_html, show, to_html
from attnscope.views.page import json_for_script
from tests.support.views import DATA_BLOCK, page_payload

HOSTILE = '</script><img src=x onerror=alert(1)> "><svg onload=alert(1)> <!-- & \u2028'


@pytest.fixture(scope="module")
def hostile_trace(minilm: attnscope.Model) -> Trace:
    tr = trace("harmless words", model=minilm)
    tr.text = HOSTILE  # the raw text reaches the page untouched by the tokenizer
    return tr


def test_json_block_cannot_close_its_script() -> None:
    text = json_for_script({"t": HOSTILE})
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert page_payload(f'<script type="application/json" id="attnscope-data">{text}</script>')["t"] == HOSTILE


def test_hostile_text_is_data_not_markup(hostile_trace: Trace) -> None:
    page = to_html(hostile_trace, "head")
    assert page.count("</script>") == 2  # the JSON block and the views' script
    assert "<img" not in page and "<svg" not in page and "<!--" not in page
    assert page_payload(page)["text"] == HOSTILE
    title = re.search(r"<title>(.*?)</title>", page, re.S)
    assert title and html.unescape(title.group(1)).endswith(HOSTILE[:59] + "…")


def test_only_the_views_script_may_run(pair_trace: Trace) -> None:
    page = to_html(pair_trace, "model")
    scripts = re.findall(r"<script>(.*?)</script>", page, re.S)
    assert len(scripts) == 1
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page)
    assert csp and f"script-src 'sha256-{digest}'" in csp.group(1) and "default-src 'none'" in csp.group(1)


def test_page_names_nothing_on_the_network(pair_trace: Trace) -> None:
    page = DATA_BLOCK.sub("", to_html(pair_trace, "all"))  # base64 data may hold "//x" by chance
    assert 'id="attnscope-data"' not in page
    assert not re.search(r"https?:|//[a-z]|\bsrc=|\bimport\(|fetch\(|XMLHttpRequest|WebSocket", page)


def test_bundle_is_the_page_style_and_script(pair_trace: Trace) -> None:
    page = to_html(pair_trace, "matrix")
    assert css() in page and js() in page
    assert bundle() == f"<style>\n{css()}</style>\n<script>\n{js()}</script>\n"
    assert "window.attnscope" in js() and "</script" not in js() and "</style" not in css()


def test_views_and_options_are_checked(pair_trace: Trace) -> None:
    with pytest.raises(AttnscopeError, match="unknown view 'graph': choose one of head, model, neuron, matrix, all"):
        to_html(pair_trace, "graph")
    with pytest.raises(AttnscopeError, match="theme 'sepia' is not known"):
        to_html(pair_trace, "head", theme="sepia")


def test_single_views_carry_neuron_data_only_when_shown(pair_trace: Trace) -> None:
    assert page_payload(to_html(pair_trace, "model"))["neuron"]["blocks"] == []
    assert len(page_payload(to_html(pair_trace, "neuron"))["neuron"]["blocks"]) == 72
    assert page_payload(to_html(pair_trace, "head", layer=3, query=2))["initial"] | {"heads": None} == {
        "view": "head", "layer": 3, "head": 0, "heads": None, "query": 2, "source": None, "theme": "auto"}


def test_notebook_display_is_an_isolated_frame_of_the_page(pair_trace: Trace) -> None:
    shown = repr_html(pair_trace)
    assert pair_trace._repr_html_() == shown
    frame = re.fullmatch(r'<div class="attnscope-frame" style="[^"]*"><iframe sandbox="allow-scripts" '
                         r'srcdoc="([^"]*)" style="[^"]*" title="attnscope view"></iframe></div>', shown)
    assert frame, shown[:300]
    assert html.unescape(frame.group(1)) == to_html(pair_trace, "all")


def test_html_page_saves_and_show_needs_jupyter(pair_trace: Trace, tmp_path: Path) -> None:
    page = HTMLPage(to_html(pair_trace, "head"))
    assert page.save(tmp_path / "v.html").read_text(encoding="utf-8") == page.data == str(page)
    with pytest.raises(AttnscopeError, match="cannot write"):
        page.save(tmp_path / "missing" / "v.html")
    with pytest.raises(AttnscopeError, match="show\\(\\) displays in Jupyter"):
        show(pair_trace, "head")
