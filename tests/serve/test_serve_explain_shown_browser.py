"""The page's explanation reads the same from /api/explain's "shown" arrays as from the whole arrays (issue 29): in
headless Chromium against the real server, a matrix cell explained twice, the second time with the request's
arrays rewritten to "all" on its way out: the same text, cell for cell (rows and columns elided alike)."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.support.serve import Server

TEXT = ("The keeper counted the waves that broke over the harbour wall before dawn, and the gulls "
        "circled the lamp while the tide turned slowly back toward the sea.")


def explain_text(page: Any, canvas: Any, cell: float, label: float, query: int, key: int) -> str:
    page.evaluate("() => { document.getElementById('sv-explain').dataset.state = ''; }")
    canvas.click(position={"x": label + (key + 0.5) * cell, "y": label + (query + 0.5) * cell})
    page.wait_for_function("() => document.getElementById('sv-explain').dataset.state === 'ready'", timeout=120_000)
    return str(page.inner_text("#sv-explain"))


def test_shown_and_all_draw_the_same_explanation(server: Server) -> None:
    from attnscope.views.browser import chromium

    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        sent: list[dict[str, Any]] = []
        page.on("request", lambda r: "/api/explain" in r.url and sent.append(json.loads(r.post_data or "{}")))
        page.goto(server.url)
        page.wait_for_selector("#sv-status[data-kind=ok]", timeout=120_000)
        page.fill("#sv-text", TEXT)
        page.click("#sv-go")
        page.wait_for_function("() => /^\\d+ tokens/.test(document.getElementById('sv-status').textContent) && "
                               "document.getElementById('sv-status').dataset.kind === 'ok'", timeout=120_000)
        page.select_option("#sv-view", "matrix")
        page.wait_for_selector("#sv-views canvas.as-matrix")
        canvas = page.locator("#sv-views canvas.as-matrix")
        cell, label = (float(canvas.get_attribute(f"data-{k}") or "nan") for k in ("cell", "label"))
        shown = explain_text(page, canvas, cell, label, 20, 3)

        def whole(route: Any) -> None:
            route.continue_(post_data=json.dumps({**json.loads(route.request.post_data or "{}"), "arrays": "all"}))

        page.route("**/api/explain", whole)
        every = explain_text(page, canvas, cell, label, 20, 3)
        page.close()
    assert [s.get("arrays") for s in sent] == ["shown", "shown"]  # the page asks for the shown form
    assert re.search(r"rows \d+\.\.\d+ of \d+ not shown", shown)  # long arrays elided: x's rows,
    assert "columns 62..381 of 384 not shown" in shown  # and its columns past 62
    assert shown == every
