"""The page never cuts what the user typed and never shows a trace it cannot serve (issue 29): a text over the
server's --max-chars stays whole, is named with its length and the flag that raises the limit, and cannot be
sent; a long trace whose maps do not fit the server's map cache is refused with what to change (a 422 before the
trace since the server sizes the maps up front; stored: false when other traces crowd them out, handled alike),
and the previous text's views are dimmed so they are not taken for the new one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.serve import MAX_CHARS, Server, start_server

LONG = " ".join(["the river ran past the old mill and the children watched it from the bridge"] * 40)


@pytest.fixture(scope="module")
def small_cache_server() -> Iterator[Server]:
    """MiniLM up to 512 tokens (a lazy trace) with a map cache of 8 MiB: too small for its uint8 maps."""
    s = start_server("--max-tokens", "512", "--max-chars", "20000", "--cache-size", "8")
    yield s
    assert s.stop() == 0, "".join(s.stderr)[-2000:]
    assert "Traceback" not in "".join(s.stderr), "".join(s.stderr)[-4000:]


def _open(browser: Any, url: str) -> Any:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(url)
    page.wait_for_selector("#sv-status[data-kind=ok]", timeout=120_000)  # the default sentence, traced
    return page


def test_an_over_long_text_stays_whole_and_says_how_to_fit(server: Server) -> None:
    from attnscope.views.browser import chromium

    text = "word " * (MAX_CHARS // 5 + 40)  # 200 characters over the limit
    with chromium() as browser:
        page = _open(browser, server.url)
        page.fill("#sv-text", text)
        assert page.input_value("#sv-text") == text  # nothing cut
        status = page.text_content("#sv-status") or ""
        assert f"Text: {len(text):,} characters, more than the {MAX_CHARS:,}" in status and "--max-chars" in status
        assert page.get_attribute("#sv-status", "data-kind") == "error" and page.is_disabled("#sv-go")
        page.fill("#sv-text", "time flies")  # fits again: the warning goes, the button comes back
        assert page.text_content("#sv-status") == "" and not page.is_disabled("#sv-go")
        page.close()


def test_a_trace_whose_maps_do_not_fit_is_refused_with_advice(small_cache_server: Server) -> None:
    from attnscope.views.browser import chromium

    with chromium() as browser:
        page = _open(browser, small_cache_server.url)
        page.fill("#sv-text", LONG)
        page.click("#sv-go")
        page.wait_for_selector("#sv-status[data-kind=error]", timeout=300_000)
        status = page.text_content("#sv-status") or ""
        assert "maps do not fit the server's map cache" in status and "--cache-size" in status, status
        assert "norm-based" in status and "the views still show the previous text" in status
        assert page.get_attribute("#sv-views", "data-stale") == "true"
        page.fill("#sv-text", "a short text fits")  # the next trace that fits is drawn, no longer dimmed
        page.click("#sv-go")
        page.wait_for_selector("#sv-status:not([data-kind=busy])", timeout=300_000)
        assert page.get_attribute("#sv-status", "data-kind") == "ok", page.text_content("#sv-status")
        assert page.get_attribute("#sv-views", "data-stale") is None
        page.close()


def test_the_ablate_and_patch_panels_run_on_the_traced_model(server: Server) -> None:
    """Ablate from the page: the measures clean and ablated, then every head alone as a grid whose cell opens
    that head in the views; patch: both grids. Numbers are the API's own (the API tests check them)."""
    from playwright.sync_api import expect

    from attnscope.views.browser import chromium

    with chromium() as browser:
        page = _open(browser, server.url)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.fill("#sv-ablate-heads", "1.2,0.7")
        page.click("#sv-ablate-go")
        page.wait_for_selector("#sv-ablate-status:not([data-kind=busy])", timeout=120_000)
        assert page.get_attribute("#sv-ablate-status", "data-kind") == "ok", page.text_content("#sv-ablate-status")
        line = page.text_content("#sv-ablate-out .sv-fx-line") or ""
        assert "heads 1.2, 0.7 removed (zero)" in line and "primary measure: embedding_distance" in line
        rows = page.locator("#sv-ablate-out .sv-fx-table tbody tr th").all_text_contents()
        assert "embedding_distance" in rows
        page.fill("#sv-ablate-heads", "")
        page.check("#sv-ablate-each")
        page.click("#sv-ablate-go")
        page.wait_for_selector("#sv-ablate-status:not([data-kind=busy])", timeout=120_000)
        assert page.get_attribute("#sv-ablate-status", "data-kind") == "ok", page.text_content("#sv-ablate-status")
        cells = page.locator("#sv-ablate-out .as-fx-cell")
        assert cells.count() >= 6 * 12  # a grid per measure, each 6 layers x 12 heads
        layer = page.locator('#sv-views select[aria-label="layer (0-indexed)"]').first
        assert layer.input_value() != "2"
        page.click('#sv-ablate-out .as-fx-cell[data-layer="2"][data-head="9"]')
        expect(layer).to_have_value("2", timeout=30_000)  # the cell opened layer 2 in the views
        page.click("#sv-patch summary")
        page.click("#sv-patch-go")
        page.wait_for_selector("#sv-patch-status:not([data-kind=busy])", timeout=120_000)
        assert page.get_attribute("#sv-patch-status", "data-kind") == "ok", page.text_content("#sv-patch-status")
        assert page.locator("#sv-patch-out .as-fx-grid").count() == 2  # recovered and lost
        line = page.text_content("#sv-patch-out .sv-fx-line") or ""
        assert "m is the pooled sentence embedding's cosine similarity" in line and "m(clean) = 1.0000" in line
        assert errors == [], errors
        page.close()
