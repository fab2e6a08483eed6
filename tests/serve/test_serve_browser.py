"""The page in headless Chromium against the real server: type, trace, switch views, click, read the explanation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import attnscope
from tests.support.pages import Watched, click_matrix_cell, open_app, trace_in_app
from tests.support.serve import ARTIFACTS, MAX_TOKENS, Server

# Hostile on purpose: both must show up as literal text and run nothing.
TEXT = "The cat </script><img src=x onerror=alert(1)> sat."
PAIR = '"><svg onload=alert(2)> It slept.'
LAYER, HEAD, QUERY, KEY = 2, 5, 3, 1


@pytest.fixture(scope="module")
def visit(server: Server) -> Iterator[Watched]:
    from attnscope.views.browser import chromium

    with chromium() as browser:
        v = open_app(browser, server.url)  # the default sentence, traced
        yield v
        v.page.close()


@pytest.fixture(scope="module")
def local(minilm: attnscope.Model) -> attnscope.Trace:
    return attnscope.trace(TEXT, PAIR, model=minilm, max_length=MAX_TOKENS)


def explanation(page: Any) -> dict[str, Any]:
    page.wait_for_selector("#sv-explain[data-state=ready]", timeout=60_000)
    return page.evaluate("""() => {
      const box = document.getElementById("sv-explain");
      const table = box.querySelector('table[data-name="weights"]');
      return {
        title: box.querySelector("h2").textContent,
        badge: box.querySelector(".sv-badge").textContent,
        ok: box.querySelector(".sv-badge").dataset.ok,
        stages: [...box.querySelectorAll(".sv-step")].map((s) => s.dataset.stage),
        columns: [...table.querySelectorAll("thead th")].slice(1).map((th) => th.title),
        hit: [...table.querySelectorAll("thead th.sv-hit")].map((th) => th.title),
        row: [...table.querySelectorAll("tbody tr:first-child td")].map((td) => td.textContent),
      };
    }""")


def shown_weights_match(shown: dict[str, Any], row: np.ndarray) -> None:
    """Each number the table shows (4 decimals) is the trace's weight for that key."""
    for title, cell in zip(shown["columns"], shown["row"], strict=True):
        if cell == "…":
            continue
        key = int(title.split(":")[0])
        assert abs(float(cell) - float(row[key])) <= 5e-5 + 1e-7, (title, cell, row[key])


def test_type_trace_switch_views_click_and_read(visit: Watched, local: attnscope.Trace) -> None:
    page = visit.page
    trace_in_app(page, TEXT, pair=PAIR)
    assert page.text_content("#sv-status").startswith(f"{local.n_tokens} tokens")

    page.select_option("#sv-view", "matrix")
    page.wait_for_selector("#sv-views canvas.as-matrix")
    page.locator("#sv-views .as-panel select").first.select_option(str(LAYER))
    page.locator("#sv-views .as-chips button", has_text=str(HEAD)).first.click()
    click_matrix_cell(page, QUERY, KEY)
    shown = explanation(page)
    visit.shot("matrix-explained", ARTIFACTS)
    assert shown["title"] == f"Layer {LAYER}, head {HEAD}, query token {QUERY} “{local.tokens[QUERY].text}”"
    assert shown["ok"] == "true" and shown["badge"].startswith("✓ verified")
    assert shown["stages"] == ["tokens", "x", "projections", "q", "k", "v", "scores", "scaled", "masked", "weights",
                               "weighted", "context", "merged", "output"]
    assert shown["hit"] == [f"{KEY}: {local.tokens[KEY].text}"]
    shown_weights_match(shown, local.weights[LAYER, HEAD, QUERY])

    page.select_option("#sv-view", "neuron")  # the selection carries over: same layer, head and query
    page.wait_for_selector("#sv-views .as-neuron [data-key]")
    page.locator("#sv-views .as-neuron .as-tok-cell[data-key='0']").click()
    page.wait_for_function("() => document.querySelector('#sv-explain h2')?.textContent.includes('query token')")
    shown = explanation(page)
    visit.shot("neuron-explained", ARTIFACTS)
    assert shown["title"].startswith(f"Layer {LAYER}, head {HEAD}, query token {QUERY} ")
    shown_weights_match(shown, local.weights[LAYER, HEAD, QUERY])


def test_user_text_stays_text_and_nothing_leaves_the_server(visit: Watched) -> None:
    page = visit.page
    assert page.evaluate("() => document.querySelectorAll('[onerror], [onload], #sv-views img, svg').length") == 0
    tokens = page.evaluate("() => [...document.querySelectorAll('#sv-explain tbody th')].map((t) => t.textContent)")
    assert any("<" in t for t in tokens)  # the WordPiece tokens of the markup, shown as text
    assert visit.dialogs == []
    assert visit.errors == []
    assert visit.requests and all(r.startswith(visit.url) for r in visit.requests), visit.requests
    assert {r.removeprefix(visit.url) for r in visit.requests} <= {"", "api/trace", "api/explain", "api/neuron"}


def test_the_words_button_on_a_traced_text(visit: Watched, minilm: attnscope.Model) -> None:
    """A short trace travels inline with its word level (views.words): the header's words button merges the
    pieces in the head view and back, as `attnscope view --word-level` does."""
    from attnscope.views.words import word_trace

    text = "An unforgettable phosphorescence."
    local = attnscope.trace(text, model=minilm, max_length=MAX_TOKENS)
    words = word_trace(local)
    assert words.n_tokens < local.n_tokens  # pieces to merge
    page = visit.page
    trace_in_app(page, text, "head", pair="")
    column = "#sv-views .as-tokens.as-q .as-tok"
    page.wait_for_selector(column)
    assert page.locator(column).all_inner_texts() == local.token_strings
    page.click("#sv-views .as-words")
    page.wait_for_selector("#sv-views .as-words[aria-pressed=true]")
    assert page.locator(column).all_inner_texts() == words.token_strings  # "unforgettable" whole
    assert f"{words.n_tokens} words" in page.text_content("#sv-views .as-meta")
    unforgettable = words.token_strings.index("unforgettable")
    page.locator(column).nth(unforgettable).click()  # the web app explains the word's first token
    first = next(t.index for t in local.tokens if t.word == words.tokens[unforgettable].word)
    page.wait_for_function("(want) => document.querySelector('#sv-explain h2')?.textContent.includes(want)",
                           arg=f"query token {first} ", timeout=60_000)
    page.click("#sv-views .as-words")
    page.wait_for_selector("#sv-views .as-words[aria-pressed=false]")
    assert page.locator(column).all_inner_texts() == local.token_strings
    assert visit.errors == []
