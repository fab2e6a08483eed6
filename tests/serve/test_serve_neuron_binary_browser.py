"""The page reads /api/neuron's binary form (issue 29): on a long MiniLM trace (512 tokens, maps lazy, so the Neuron
tab asks the server for each head), the page asks with Accept: application/x-attnscope-arrays for the query it
shows, the server answers that query's row in the binary form (serve.rows.neuron_binary), and the neuron view shows
that block's float32 numbers bit for bit, as it does from JSON (tests/serve/test_serve_rows.py compares the two forms
stage by stage, test_serve_neuron_rows.py a row with the whole block's)."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from attnscope.serve import binary
from tests.support.serve import Server

TOKENS = 512
TEXT = " ".join(["The keeper counted the waves that broke over the harbour wall before dawn."] * 40)


def test_the_neuron_view_reads_the_binary_form(long_server: Server) -> None:
    from attnscope.views.browser import chromium

    asked: list[str] = []
    blocks: dict[tuple[int, int, int | None], dict[str, np.ndarray]] = {}
    fields_of: dict[tuple[int, int, int | None], dict[str, Any]] = {}

    def answer(route: Any) -> None:
        asked.append(route.request.headers.get("accept", ""))
        response = route.fetch()  # the real server's answer, passed on as it came
        assert response.headers["content-type"].startswith(binary.MEDIA_TYPE)
        fields, arrays = binary.decode(response.body())
        blocks[(fields["layer"], fields["head"], fields.get("query"))] = arrays
        fields_of[(fields["layer"], fields["head"], fields.get("query"))] = fields
        route.fulfill(response=response)

    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.route("**/api/neuron", answer)
        page.goto(long_server.url)
        page.wait_for_selector("#sv-status[data-kind=ok]", timeout=120_000)
        page.uncheck("#sv-norms")
        page.uncheck("#sv-rollout")
        page.fill("#sv-text", TEXT)
        page.click("#sv-go")
        page.wait_for_function(f"() => document.getElementById('sv-status').textContent.startsWith('{TOKENS} tokens')",
                               timeout=300_000)
        page.select_option("#sv-view", "neuron")
        page.wait_for_selector("#sv-views .as-neuron-body[data-rows=all]", timeout=120_000)  # every key row built
        state = page.evaluate("() => document.getElementById('sv-views').attnscopeShown.state()")
        query = page.evaluate("() => { const s = document.getElementById('sv-views').attnscopeShown; "
                              "return window.attnscope.neuronQuery(s.model, s.state()); }")
        shown = {s: values(page, s) for s in ("weights", "scores", "scaled")}
        page.select_option(".as-panel select[aria-label^='query']", str(TOKENS - 2))  # another query: its own row
        page.wait_for_function(f"() => document.querySelector('#sv-views .as-query-tok')?.textContent"
                               f"?.startsWith('{TOKENS - 2}')", timeout=120_000)
        page.wait_for_selector("#sv-views .as-neuron-body[data-rows=all]", timeout=120_000)
        other = values(page, "weights")
        figure = page.evaluate("() => window.attnscope.figureSVG(document.getElementById('sv-views'), 'neuron')")
        fetched = len(asked)  # the head view, then the Neuron tab again: drawn anew from the row already fetched
        page.select_option("#sv-view", "head")
        page.wait_for_selector("#sv-views .as-panel[data-view='head']", timeout=120_000)
        page.select_option("#sv-view", "neuron")
        page.wait_for_selector("#sv-views .as-panel[data-view='neuron'] .as-neuron-body[data-rows=all]",
                               timeout=120_000)
        again = values(page, "weights")
        page.close()
    assert errors == []
    assert asked and all(a.startswith(binary.MEDIA_TYPE) for a in asked)  # the page asks for the binary form
    # a long trace: the page asks for the query it shows, and the block holds that row ([1, key], float32 as sent)
    row = blocks[(state["layer"], state["head"], query)]
    assert row["weights"].shape == (1, TOKENS) and len(shown["weights"]) == TOKENS
    for s in ("weights", "scores"):
        np.testing.assert_array_equal(np.float32(shown[s]), row[s][0])  # the block's float32, bit for bit
    # scaled is computed in the page (Math.fround of scores x scaling): numpy's float32 product exactly
    scaling = np.float32(fields_of[(state["layer"], state["head"], query)]["scaling"])
    np.testing.assert_array_equal(np.float32(shown["scaled"]), row["scores"][0] * scaling)
    np.testing.assert_array_equal(np.float32(other), blocks[(state["layer"], state["head"], TOKENS - 2)]["weights"][0])
    assert len(asked) == fetched and again == other  # the row kept across the change of view, not asked again
    # the neuron figure draws from the row block too: the exact figure, q the row's float32 bit for bit
    assert "exact float32" in figure and "8-bit approximation" not in figure, figure[-600:]
    q_cells = re.search(r'<g class="q">(.*?)</g>', figure, re.S)
    assert q_cells is not None
    drawn_q = np.float32([float(v) for v in re.findall(r'data-value="([^"]+)"', q_cells.group(1))])
    np.testing.assert_array_equal(drawn_q, blocks[(state["layer"], state["head"], TOKENS - 2)]["q"][0])
    assert json.dumps(state)  # the state is plain data


def values(page: Any, stage: str) -> list[float]:
    return page.eval_on_selector_all(f".as-neuron-scores .as-neuron [data-stage='{stage}']",
                                     "ns => ns.map(n => Number(n.dataset.value))")
