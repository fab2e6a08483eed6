"""The page's attribution and faithfulness panels in headless Chromium against the real server (the bundled
MiniLM): each panel draws the server's answer for the text the views show, equal to the library's numbers; a head
picked in the matrix view links to what that head contributes; the server's refusal shows in the panel; a hostile
text shows up as literal text and runs nothing; the page asks nothing of any other origin."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import attnscope
from attnscope.faithfulness.run import Settings, example_rows
from attnscope.stats.sources import Document
from tests.support.pages import Watched, click_matrix_cell, open_app, trace_in_app
from tests.support.serve import ARTIFACTS, MAX_TOKENS, Server

# Hostile on purpose: it must show up as literal text and run nothing.
TEXT = "The cat </script><img src=x onerror=alert(1)> sat."
SHORT = "x <b>"  # four removable tokens: every subset of them measured in a few seconds
LONG = "<b>" + " and so on" * 12 + "</b>"  # over the shared server's 32 tokens
LAYER, HEAD, QUERY = 2, 5, 3


@pytest.fixture(scope="module")
def browser(server: Server) -> Iterator[Watched]:
    """The page, its default sentence traced, then TEXT traced in the matrix view."""
    from attnscope.views.browser import chromium

    with chromium() as b:
        v = open_app(b, server.url)
        trace_in_app(v.page, TEXT, "matrix")
        yield v


def tick(page: Any, prefix: str, methods: list[str]) -> None:
    """Exactly these methods' boxes ticked in one panel."""
    for box in page.locator(f"input[name='{prefix}-method']").all():
        if box.is_enabled():
            box.set_checked(box.get_attribute("value") in methods)


def wait_done(page: Any, name: str) -> str:
    page.wait_for_function(f"() => ['ok', 'error'].includes(document.getElementById('sv-{name}-status').dataset.kind)",
                           timeout=120_000)
    assert page.get_attribute(f"#sv-{name}-status", "data-kind") == "ok", page.text_content(f"#sv-{name}-status")
    return str(page.text_content(f"#sv-{name}-status"))


def heat_row(page: Any, method: str) -> np.ndarray:
    """A method's drawn scores (the heatmap cells' data-value) of target 0."""
    values = page.eval_on_selector_all(f"#sv-attr-out .as-attr-heat tr[data-method='{method}'] .as-attr-cell",
                                       "cells => cells.map(c => c.dataset.value)")
    return np.array([float(v) for v in values])


def test_the_attribution_panel_draws_the_librarys_scores(browser: Watched, minilm: attnscope.Model) -> None:
    page = browser.page
    saliency = page.locator("input[name='sv-attr-method'][value='saliency']")
    assert saliency.is_disabled()  # an encoder's pooled embedding is at its maximum: no gradient to read
    assert "cosine similarity of its pooled embedding" in str(page.get_attribute(
        "#sv-attr-methods label:has(input[value='saliency'])", "title"))
    assert not page.is_visible("#sv-attr-target")  # an encoder explains its embedding, not a target
    tick(page, "sv-attr", ["attention", "rollout", "leave_one_out"])
    page.click("#sv-attr-go")
    wait_done(page, "attr")
    rows = page.eval_on_selector_all("#sv-attr-out .as-attr-heat tr[data-method]", "rows => rows.map(r => "
                                     "r.dataset.method)")
    assert rows == ["attention", "rollout", "leave_one_out"]
    direct = attnscope.attribute(TEXT, model=minilm, methods="attention,rollout,leave_one_out", max_length=MAX_TOKENS)
    for name in rows:
        assert np.abs(heat_row(page, name) - direct.methods[name].scores[0]).max() <= 1e-5, name
    cells = page.locator("#sv-attr-out .as-attr-heat tr[data-method='attention'] .as-attr-cell").all_inner_texts()
    assert "</script><" in "".join(cells) and page.locator("#sv-attr-out img").count() == 0


def test_a_head_picked_in_the_views_links_to_what_it_contributes(browser: Watched, minilm: attnscope.Model) -> None:
    page = browser.page
    page.locator("#sv-views .as-panel select").first.select_option(str(LAYER))
    page.locator("#sv-views .as-chips button", has_text=str(HEAD)).first.click()
    click_matrix_cell(page, QUERY, 1)
    page.wait_for_selector("#sv-links:not([hidden]) #sv-link-head")
    assert page.text_content("#sv-links").startswith(f"layer {LAYER}, head {HEAD}:")
    assert page.locator("#sv-link-search").count() == 0  # no corpus index on this server
    page.click("#sv-link-head")
    status = wait_done(page, "attr")
    assert status.startswith(f"what layer {LAYER}, head {HEAD} contributes")
    weights = attnscope.trace(TEXT, model=minilm, max_length=MAX_TOKENS).weights[LAYER, HEAD]  # [query, key]
    assert np.abs(heat_row(page, "attention") - weights.mean(axis=0)).max() <= 1e-6  # the pooled objective's row
    assert page.locator("#sv-attr-out .as-attr-heat tr[data-method]").count() == 1  # an encoder: attention alone


def test_the_faithfulness_panel_draws_every_methods_curves(browser: Watched, minilm: attnscope.Model) -> None:
    page = browser.page
    tick(page, "sv-faith", ["attention", "rollout"])
    page.fill("#sv-faith-seeds", "2")
    trace_in_app(page, LONG)  # traced cut to the server's 32 tokens; the panel sends the text as it is
    page.click("#sv-faith-go")
    page.wait_for_function("() => document.getElementById('sv-faith-status').dataset.kind === 'error'",
                           timeout=120_000)
    assert f"over this server's limit of {MAX_TOKENS}: shorten it" in str(page.text_content("#sv-faith-status"))
    trace_in_app(page, SHORT)
    page.click("#sv-faith-go")
    wait_done(page, "faith")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator("#sv-faith").screenshot(path=str(ARTIFACTS / "faithfulness-panel.png"))
    want = example_rows(minilm, Document(SHORT, "request"), 0, Settings(methods=("attention", "rollout"), seeds=2,
                                                                       max_length=MAX_TOKENS))
    names = [r["method"] for r in want]
    assert names == ["attention", "rollout", "leave_one_out", "random_0", "random_1", "position"]
    for kind in ("deletion", "insertion"):
        lines = page.eval_on_selector_all(f"#sv-faith-out svg[data-kind='{kind}'] polyline",
                                          "ls => ls.map(l => [l.dataset.method, +l.dataset.points, "
                                          "l.getAttribute('points').split(' ').length])")
        assert lines == [[r["method"], len(r[kind]), len(r[kind])] for r in want], kind
    assert page.eval_on_selector_all("#sv-faith-out .sv-legend li", "ls => ls.map(l => l.dataset.method)") == names
    drawn = page.eval_on_selector_all("#sv-faith-out tr[data-method] td[data-key='naopc']",
                                      "cs => cs.map(c => c.dataset.value)")
    assert np.abs(np.array([float(v) for v in drawn]) - np.array([r["naopc"] for r in want])).max() <= 1e-5
    assert str(page.text_content("#sv-faith-out .sv-faith-tokens")).endswith("x · < · b · >")  # as text
    assert page.locator("#sv-faith-out b").count() == 0


def test_nothing_ran_and_nothing_left_the_page(browser: Watched) -> None:
    page = browser.page
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 1400  # the answers drawn: no sideways scroll
    assert page.locator("img").count() == 0 and browser.dialogs == []
    assert all(url.startswith(browser.url) for url in browser.requests), browser.requests
    # the one console line the refusal above leaves ("Failed to load resource: ... 422"), and nothing else
    assert [e for e in browser.errors if "status of 422" not in e] == []
    assert len(browser.errors) == 1
