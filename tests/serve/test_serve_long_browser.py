"""A long trace in the web app, in headless Chromium against a real server (issue 16): 512 tokens on MiniLM come
without their maps, the page fetches each map as it shows it (the selected head first, then the layer's other
heads in the background), and the numbers it decodes from the
binary form are the trace's bit for bit. First paint and a layer switch are measured and printed, never asserted."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attnscope.serve import binary
from tests.support.serve import Server, decode

TOKENS = 512
TEXT = " ".join(["The keeper counted the waves that broke over the harbour wall before dawn."] * 40)
NEXT_FRAME = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
# bytes of a typed array in the page as base64 (small arrays), or their SHA-256 (large ones), for bit-for-bit checks
B64 = """(values) => { const b = new Uint8Array(values.buffer, values.byteOffset, values.byteLength); let s = "";
  for (let i = 0; i < b.length; i += 8192) s += String.fromCharCode(...b.subarray(i, i + 8192)); return btoa(s); }"""
SHA = """async (values) => [...new Uint8Array(await crypto.subtle.digest("SHA-256", new Uint8Array(values.buffer,
  values.byteOffset, values.byteLength)))].map((x) => x.toString(16).padStart(2, "0")).join("")"""


def exact_map(server: Server, page: Any, layer: int, head: int) -> np.ndarray:
    """The map the page shows, as float32 from the server (its trace cache), read by the Python decoder."""
    url = server.url.rstrip("/") + shown(page, "s.model.payload.maps.url")
    with server.client() as c:
        r = c.get(url, params={"layer": layer, "head": head, "precision": "float32"})
    assert r.status_code == 200, r.text
    return binary.decode(r.content)[1]["weights"]


@pytest.fixture(scope="module")
def page(long_server: Server) -> Iterator[Any]:
    from attnscope.views.browser import chromium

    with chromium() as browser:
        p = browser.new_page(viewport={"width": 1400, "height": 1000})
        p.requests = []  # type: ignore[attr-defined]
        p.errors = []  # type: ignore[attr-defined]
        p.on("request", lambda r: p.requests.append(r.url))  # type: ignore[attr-defined]
        p.on("pageerror", lambda e: p.errors.append(str(e)))  # type: ignore[attr-defined]
        p.goto(long_server.url)
        p.wait_for_selector("#sv-status[data-kind=ok]", timeout=60_000)  # the default sentence, traced
        p.uncheck("#sv-norms")
        p.uncheck("#sv-rollout")
        p.fill("#sv-text", TEXT)
        p.click("#sv-go")
        p.wait_for_function(f"() => document.getElementById('sv-status').textContent.startsWith('{TOKENS} tokens')",
                            timeout=120_000)
        p.evaluate(NEXT_FRAME)
        yield p
        assert not p.errors, p.errors  # type: ignore[attr-defined]
        p.close()


def shown(page: Any, expression: str) -> Any:
    """expression over s, the drawn views' model and state (attnscopeShown)."""
    return page.evaluate(f"() => {{ const s = document.getElementById('sv-views').attnscopeShown; "
                         f"return {expression}; }}")


def test_long_trace_arrives_without_maps_and_fetches_the_layer_shown(page: Any) -> None:
    assert shown(page, "s.model.lazy && s.model.n") == TOKENS
    assert "maps fetched as shown" in page.text_content("#sv-status")
    page.wait_for_function("() => document.querySelector('.as-panel .as-status').dataset.pending === '0'")
    fetched = [u for u in page.requests if "/map?" in u]
    assert fetched[0].endswith("layer=0&head=0")  # the head shown first, then the layer's other heads
    assert fetched[1:] == [fetched[0][: -len("&head=0")]]  # then the rest of the layer in one request
    assert shown(page, "[0, 1].map((l) => s.model.sources.get('weights').loaded(l, 0))") == [True, False]
    ms = page.evaluate("""() => { const t = performance.getEntriesByName("sv:traced").pop().startTime;
      return performance.getEntriesByName("attnscope:ready").pop().startTime - t; }""")
    print(f"\n{TOKENS} tokens on MiniLM in the web app: first paint {ms:.0f} ms after the trace arrived "
          "(page clock: sv:traced -> attnscope:ready)")


def test_layer_switch_fetches_that_layer_and_draws_its_maps(page: Any, long_server: Server) -> None:
    start = page.evaluate("() => performance.now()")
    page.select_option(".as-panel select[aria-label='layer (0-indexed)']", "3")
    page.wait_for_function("() => !document.getElementById('sv-views').dataset.attnscopeLoading")
    page.evaluate(NEXT_FRAME)
    ms = page.evaluate("() => performance.now()") - start
    assert shown(page, "[s.state().layer, s.model.sources.get('weights').loaded(3, s.state().head)]") == [3, True]
    page.wait_for_function("() => document.querySelector('.as-panel .as-status').dataset.pending === '0'")
    page.evaluate(NEXT_FRAME)
    every = page.evaluate("() => performance.now()") - start
    print(f"\nlayer switch at {TOKENS} tokens: {ms:.0f} ms to the selected head drawn, {every:.0f} ms to all 12 "
          "(fetches included)")
    layer3 = [u for u in page.requests if "layer=3" in u]
    assert len(layer3) == 2 and layer3[1] == layer3[0][: layer3[0].index("&head=")]  # the head shown, then the layer
    codes = np.frombuffer(base64.b64decode(page.evaluate(
        f"() => ({B64})(document.getElementById('sv-views').attnscopeShown.model.sources.get('weights').codes(3, 5))")),
        dtype=np.uint8).reshape(TOKENS, TOKENS)
    scale = shown(page, "s.model.sources.get('weights').scale(3, 5)")
    w = exact_map(long_server, page, 3, 5).astype(np.float64)
    assert scale == pytest.approx(w.max(), abs=1e-6)
    assert np.abs(codes / 255.0 * scale - w).max() <= scale / 510 + 1e-5  # uint8 within half a step


def test_numbers_the_page_decodes_are_the_trace_bit_for_bit(page: Any, long_server: Server) -> None:
    exact = page.evaluate(f"""async () => {{
      const m = document.getElementById('sv-views').attnscopeShown.model;
      return ({B64})((await m.map(2, 7, {{ precision: "float32" }})).values); }}""")
    assert base64.b64decode(exact) == exact_map(long_server, page, 2, 7).tobytes()  # (== the trace: test_serve_long)
    # and /api/trace's binary form, decoded by the page's own decoder, against its base64 JSON form
    request = {"text": TEXT, "max_length": 64, "stages": ["weights", "q"]}
    shape, weights, q = page.evaluate(f"""async (request) => {{
      const r = await fetch("/api/trace", {{ method: "POST", body: JSON.stringify(request),
        headers: {{ "Content-Type": "application/json", Accept: "application/x-attnscope-arrays" }} }});
      const {{ arrays }} = window.attnscope.decodeArrays(await r.arrayBuffer());
      return [arrays.weights.spec.shape, await ({SHA})(arrays.weights.values), await ({SHA})(arrays.q.values)]; }}""",
        request)
    with long_server.client() as c:
        sent = c.post("/api/trace", json=request).json()["arrays"]
    assert shape == sent["weights"]["shape"] == [6, 12, 64, 64]
    assert weights == hashlib.sha256(decode(sent["weights"]).tobytes()).hexdigest()
    assert q == hashlib.sha256(decode(sent["q"]).tobytes()).hexdigest()


def test_model_view_draws_every_map_from_summaries(page: Any) -> None:
    before = len([u for u in page.requests if "/map?" in u])
    page.select_option("#sv-view", "model")
    page.wait_for_selector(".as-panel[data-view=model] .as-thumb", timeout=60_000)
    assert page.locator(".as-panel .as-thumb").count() == 6 * 12
    assert len([u for u in page.requests if "/map?" in u]) == before  # thumbnails from the overviews: no fetch
    sides = page.eval_on_selector_all(".as-panel .as-thumb[data-layer='5'] canvas", "cs => cs.map((c) => c.width)")
    assert len(sides) == 12 and max(sides) <= 64  # pooled from the 64 x 64 overview, never a 512 x 512 stand-in
    assert shown(page, "s.model.sources.get('weights').loaded(5, 0)") is False


def test_a_figure_waits_for_the_maps_it_draws(page: Any) -> None:
    """Exported before the layer's heads have arrived, the head view's figure still draws every head from its
    map, never from its overview: the download waits for them (layer 4's fetches are held back 1.5 s here)."""
    page.evaluate("""() => { const A = window.attnscope, get = A.getBinary;
      A.getBinary = (url) => new Promise((r) => setTimeout(r, url.includes("layer=4") ? 1500 : 0)).then(() => get(url));
    }""")
    page.select_option("#sv-view", "head")
    page.wait_for_selector(".as-panel[data-view=head]", timeout=60_000)
    page.select_option(".as-panel select[aria-label='layer (0-indexed)']", "4")
    page.wait_for_function("() => !document.getElementById('sv-views').dataset.attnscopeLoading", timeout=60_000)
    heads = shown(page, "s.state().heads")
    loaded = "(hs) => hs.map((h) => document.getElementById('sv-views').attnscopeShown.model.sources.get('weights')" \
             ".loaded(4, h))"
    assert len(heads) > 1 and not all(page.evaluate(loaded, heads))  # the other heads are still on their way
    with page.expect_download() as got:
        page.click("#sv-views .as-export[data-format=svg]")
    figure = Path(got.value.path()).read_text(encoding="utf-8")
    assert all(page.evaluate(loaded, heads))
    assert figure == page.evaluate("() => window.attnscope.figureSVG(document.getElementById('sv-views'))")
    assert "layer 4" in figure and f"heads {', '.join(map(str, heads))}" in figure
