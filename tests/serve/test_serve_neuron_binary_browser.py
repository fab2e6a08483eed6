"""The page reads /api/neuron's binary form (issue 29): on a long MiniLM trace (512 tokens, maps lazy, so the Neuron
tab asks the server for each head), the page asks with Accept: application/x-attnscope-arrays; its answer here is
the server's own JSON block re-sent in the binary form (serve.binary, as serve.rows.neuron_binary lays it out), and
the neuron view shows that block's float32 numbers bit for bit, as it does from JSON."""

from __future__ import annotations

import base64
import json
import zlib
from typing import Any

import numpy as np

from attnscope.serve import binary
from tests.support.serve import Server

TOKENS = 512
TEXT = " ".join(["The keeper counted the waves that broke over the harbour wall before dawn."] * 40)
SIZES = {"q": "token", "k": "token", "v": "token", "context": "token", "scores": "key", "weights": "key"}


def as_binary(block: dict[str, Any], n: int) -> bytes:
    """A JSON neuron block -> the binary form: its fields as the header, each stage an array."""
    raw = base64.b64decode(block["data"])
    flat = np.frombuffer(zlib.decompress(raw) if block["encoding"].endswith("+zlib") else raw, "<f4")
    d, at, arrays = block["d_head"], 0, {}
    for s in block["stages"]:
        shape = (n, d) if SIZES[s] == "token" else (n, n)
        arrays[s] = (flat[at:at + shape[0] * shape[1]].reshape(shape), ("token", "d_head"))
        at += shape[0] * shape[1]
    fields = {k: v for k, v in block.items() if k not in ("encoding", "data")}
    return binary.encode(fields, arrays, "float32")


def test_the_neuron_view_reads_the_binary_form(long_server: Server) -> None:
    from attnscope.views.browser import chromium

    asked: list[str] = []
    blocks: dict[tuple[int, int], dict[str, Any]] = {}

    def answer(route: Any) -> None:
        asked.append(route.request.headers.get("accept", ""))
        response = route.fetch()  # the real server's answer (JSON)
        block = response.json()
        blocks[(block["layer"], block["head"])] = block
        route.fulfill(status=200, body=as_binary(block, TOKENS), content_type=binary.MEDIA_TYPE)

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
        page.wait_for_selector("#sv-views .as-neuron-scores .as-neuron [data-stage='weights']", timeout=120_000)
        state = page.evaluate("() => document.getElementById('sv-views').attnscopeShown.state()")
        query = page.evaluate("() => { const s = document.getElementById('sv-views').attnscopeShown; "
                              "return window.attnscope.neuronQuery(s.model, s.state()); }")
        shown = page.eval_on_selector_all(".as-neuron-scores .as-neuron [data-stage='weights']",
                                          "ns => ns.map(n => Number(n.dataset.value))")
        page.close()
    assert errors == []
    assert asked and all(a.startswith(binary.MEDIA_TYPE) for a in asked)  # the page asks for the binary form
    block = blocks[(state["layer"], state["head"])]
    raw = base64.b64decode(block["data"])
    flat = np.frombuffer(zlib.decompress(raw) if block["encoding"].endswith("+zlib") else raw, "<f4")
    at = sum((TOKENS * block["d_head"] if SIZES[s] == "token" else TOKENS * TOKENS)
             for s in block["stages"][:block["stages"].index("weights")])
    weights = flat[at:at + TOKENS * TOKENS].reshape(TOKENS, TOKENS)[query]
    assert len(shown) == TOKENS
    np.testing.assert_array_equal(np.float32(shown), weights)  # the block's float32, bit for bit
    assert json.dumps(state)  # the state is plain data
