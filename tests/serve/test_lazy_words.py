"""Word level on long (lazily sent) traces in the web app (issue 16), on a real server with the bundled MiniLM: the
lazy payload says whether words differ from tokens and carries the words' own lazy payload; `GET
/api/trace/{id}/map?level=words` sends word maps (uint8 merged from the stored codes, within the stated bound of
the exact merge; float32 views.words' merge of the trace's map, bit for bit); bad levels are one line (422); and in
Chromium the header's words button switches the head, matrix and model views to words and back."""

from __future__ import annotations

import base64
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

import attnscope
from attnscope.records.trace import Trace
from attnscope.serve import binary
from attnscope.serve.maps import OVERVIEW, WordLevel
from attnscope.serve.quantize import overview
from attnscope.serve.wordmaps import from_codes
from attnscope.views.words import merge, word_groups, word_trace
from tests.support.serve import Server

# 310 tokens, 156 words: every word of the sentence but "the" and "." is split into pieces or joined by "'"
TEXT = " ".join(["The lighthouse keeper's unforgettable phosphorescence mesmerised weatherbeaten fishermen."] * 14)
PLAIN = "the cat sat on the mat"  # every word one token


@pytest.fixture(scope="module")
def http(long_server: Server) -> Iterator[httpx.Client]:
    with long_server.client(timeout=120) as c:
        yield c


def lazy_payload(http: httpx.Client, text: str) -> dict[str, Any]:
    r = http.post("/api/trace", json={"text": text, "stages": [], "payload": True, "maps": "lazy", "sources": []})
    assert r.status_code == 200, r.text
    return dict(r.json()["payload"])


@pytest.fixture(scope="module")
def lazy(http: httpx.Client) -> dict[str, Any]:
    return lazy_payload(http, TEXT)


@pytest.fixture(scope="module")
def local() -> Trace:
    """The same text traced in this process (the server's numbers agree within float32's 1e-5)."""
    return attnscope.trace(TEXT, max_length=512)


def fetch(http: httpx.Client, url: str, **params: Any) -> tuple[dict[str, Any], np.ndarray, np.ndarray | None]:
    """One map response: its header, its values (uint8 decoded to float32) and, for uint8, the codes as sent."""
    r = http.get(url, params=params)
    assert r.status_code == 200 and r.headers["content-type"] == binary.MEDIA_TYPE, r.text
    header, arrays = binary.decode(r.content)
    spec = header["arrays"]["weights"]
    if spec["dtype"] != "uint8":
        return header, arrays["weights"], None
    start = len(r.content) - spec["nbytes"] - -spec["nbytes"] % 8
    codes = np.frombuffer(r.content[start:start + spec["nbytes"]], dtype=np.uint8).reshape(spec["shape"])
    return header, arrays["weights"], codes


def words_of(tr: Trace) -> WordLevel:
    groups = word_groups(tr)
    unit = np.array([next(u for u, g in enumerate(groups) if i in g) for i in range(len(tr.tokens))])
    return WordLevel(groups, unit, np.array([len(g) for g in groups], dtype=np.float64))


def test_lazy_payload_says_words_and_carries_their_summaries(lazy: dict[str, Any], local: Trace,
                                                             http: httpx.Client) -> None:
    wt = word_trace(local)
    level, words = lazy["word_level"], lazy["words"]
    assert len(lazy["tokens"]) == len(local.tokens) == 310 and len(wt.tokens) == 156
    assert level["available"] and level["toggle"] and level["reason"] is None
    assert level["words"] == words["tokens"] == [t.text for t in wt.tokens]
    assert level["word_of"] == words_of(local).unit.tolist()
    assert words["maps"] == lazy["maps"] | {"level": "words"} and words["level"] == "words"
    assert words["neuron"]["available"] is False and "word_level" not in words
    spec = words["sources"][0]
    assert spec["name"] == "weights" and spec["shape"] == [6, 12, 156, 156] and spec["encoding"] == "lazy"
    # each word map's scale and overview are those of the word maps the endpoint sends (one layer, all heads)
    header, _, codes = fetch(http, lazy["maps"]["url"], layer=4, level="words")
    assert codes is not None and codes.shape == (12, 156, 156)
    assert spec["scales"][4 * 12:5 * 12] == header["arrays"]["weights"]["scales"]
    o = spec["overview"]
    pooled = np.frombuffer(zlib.decompress(base64.b64decode(o["data"])), dtype=np.uint8)
    assert np.array_equal(pooled.reshape(6, 12, *o["shape"])[4], overview(codes, OVERVIEW))


def test_uint8_word_maps_are_the_stored_codes_merged_within_the_bound(lazy: dict[str, Any], local: Trace,
                                                                      http: httpx.Client) -> None:
    url, words = lazy["maps"]["url"], words_of(local)
    exact = word_trace(local).arrays["weights"]  # [layer, head, word, word]
    for layer, head in ((0, 0), (3, 7), (5, 11)):
        token_header, _, token_codes = fetch(http, url, layer=layer, head=head)
        header, got, codes = fetch(http, url, layer=layer, head=head, level="words")
        assert header["level"] == "words" and (header["n_query"], header["n_key"]) == (156, 156)
        s, s_w = token_header["arrays"]["weights"]["scales"][0], header["arrays"]["weights"]["scales"][0]
        # byte for byte: the token map's stored codes, merged (views.words' units) and quantized again
        again, scale = binary.quantize_maps(from_codes(token_codes[None], np.array([s]), words))
        assert np.array_equal(codes, again[0]) and s_w == float(scale[0])
        # within the stated bound of the exact merge: (p * s + s_w) / 510, p the key word's pieces
        bound = (words.pieces[None, :] * s + s_w) / 510 + 1e-5 * words.pieces[None, :]  # + the two traces' 1e-5
        assert (np.abs(got - exact[layer, head]) <= bound).all()
    _, layer_maps, _ = fetch(http, url, layer=3, level="words")  # a whole layer: the same maps, head by head
    assert np.array_equal(layer_maps[7], fetch(http, url, layer=3, head=7, level="words")[1])


def test_float32_word_maps_are_the_merge_of_the_traces_map(lazy: dict[str, Any], local: Trace,
                                                            http: httpx.Client) -> None:
    url, groups = lazy["maps"]["url"], word_groups(local)
    tokens = fetch(http, url, layer=2, head=5, precision="float32")[1]  # the server's exact map
    header, got, _ = fetch(http, url, layer=2, head=5, precision="float32", level="words")
    assert got.dtype == np.float32 and got.shape == (156, 156) and header["check_ok"] is True
    assert got.tobytes() == merge(tokens.copy(), groups).tobytes()  # views.words' merge, bit for bit
    assert np.abs(got - word_trace(local).arrays["weights"][2, 5]).max() <= 1e-5 * 4  # 1e-5 per piece summed
    assert np.allclose(got.sum(axis=-1), 1.0, atol=1e-5)  # a word's row is still a distribution


@pytest.mark.parametrize(("params", "says"), [
    ({"layer": "0", "level": "Words"}, "level 'Words' is not known: use tokens or words"),
    ({"layer": "0", "level": "words", "head": "12"}, "head 12 is out of range"),
    ({"level": "words"}, "parameter 'layer' is required"),
])
def test_bad_level_requests_are_one_line(lazy: dict[str, Any], http: httpx.Client, params: dict[str, str],
                                         says: str) -> None:
    r = http.get(lazy["maps"]["url"], params=params)
    assert r.status_code == 422 and says in r.json()["error"] and "\n" not in r.json()["error"], r.text


def test_a_trace_without_word_pieces_has_no_word_level(http: httpx.Client) -> None:
    p = lazy_payload(http, PLAIN)
    assert p["word_level"]["available"] is False and "words" not in p and "one token" in p["word_level"]["reason"]
    r = http.get(p["maps"]["url"], params={"layer": "0", "level": "words"})
    assert r.status_code == 422 and "no word pieces" in r.json()["error"] and "level=tokens" in r.json()["error"]


SHOWN = "document.getElementById('sv-views').attnscopeShown"
# the page's own drawing, as the web app's serve.js does it: A.render(#sv-views, payload, {view, layer, head, ...})
DRAW = """async ([view, keep]) => { const A = window.attnscope, root = document.getElementById('sv-views');
  if (window.ctl) window.ctl.destroy();
  window.ctl = await A.render(root, window.lazyPayload, Object.assign({ view: view }, keep)); }"""
FIGURE = "() => window.attnscope.figureSVG(document.getElementById('sv-views'), 'head')"
B64 = """(values) => { const b = new Uint8Array(values.buffer, values.byteOffset, values.byteLength); let s = "";
  for (let i = 0; i < b.length; i += 8192) s += String.fromCharCode(...b.subarray(i, i + 8192)); return btoa(s); }"""


@pytest.fixture(scope="module")
def page(long_server: Server, lazy: dict[str, Any]) -> Iterator[Any]:
    """The web app's page showing the lazy payload of TEXT (310 tokens: "auto" would send it inline)."""
    from attnscope.views.browser import chromium

    with chromium() as browser:
        p = browser.new_page(viewport={"width": 1400, "height": 1000})
        p.requests = []  # type: ignore[attr-defined]
        p.errors = []  # type: ignore[attr-defined]
        p.explained = []  # type: ignore[attr-defined]
        p.on("request", lambda r: p.requests.append(r.url))  # type: ignore[attr-defined]
        p.on("request", lambda r: "/api/explain" in r.url and p.explained.append(r.post_data_json))  # type: ignore
        p.on("pageerror", lambda e: p.errors.append(str(e)))  # type: ignore[attr-defined]
        p.goto(long_server.url)
        p.wait_for_selector("#sv-status[data-kind=ok]", timeout=60_000)  # the default sentence, traced
        status = p.evaluate("""async (text) => { const r = await fetch('/api/trace', { method: 'POST',
          headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(
          { text: text, stages: [], payload: true, maps: 'lazy', sources: [] }) });
          window.lazyPayload = (await r.json()).payload; return r.status; }""", TEXT)
        assert status == 200
        yield p
        assert not p.errors, p.errors  # type: ignore[attr-defined]
        p.close()


def shown(page: Any, expression: str) -> Any:
    return page.evaluate(f"() => {{ const s = {SHOWN}; return {expression}; }}")


def word_requests(page: Any) -> list[str]:
    return [u for u in page.requests if "/map?" in u and "level=words" in u]


def test_words_button_switches_head_matrix_and_model_views_and_back(page: Any, lazy: dict[str, Any],
                                                                    http: httpx.Client) -> None:
    word_of = lazy["word_level"]["word_of"]
    piece = next(i for i in range(1, len(word_of)) if word_of[i] == word_of[i - 1])  # a word's second piece
    word, first = word_of[piece], word_of.index(word_of[piece])
    page.evaluate(DRAW, ["head", {"layer": 2, "head": 3, "query": piece}])
    assert shown(page, "[s.model.n, s.model.lazy, s.state().query]") == [310, True, piece]
    page.click(".as-words")  # tokens -> words: the same layer, head and query (its word)
    page.wait_for_function(f"() => {SHOWN}.model.n === 156 && document.querySelector('.as-panel .as-status')"
                           ".dataset.pending === '0'", timeout=60_000)
    assert shown(page, "[s.view(), s.state().layer, s.state().head, s.state().query]") == ["head", 2, 3, word]
    assert page.get_attribute(".as-words", "aria-pressed") == "true"
    assert "12 heads · 156 words ·" in page.text_content(".as-meta")
    assert any(u.endswith("level=words&layer=2&head=3") for u in word_requests(page))  # the head shown first
    column = page.locator(".as-panel .as-tokens.as-q .as-tok")
    assert column.count() == 156 and column.nth(word).text_content().strip() == lazy["words"]["tokens"][word]
    codes = base64.b64decode(shown(page, f"({B64})(s.model.sources.get('weights').codes(2, 3))"))
    assert codes == fetch(http, lazy["maps"]["url"], layer=2, head=3, level="words")[2].tobytes()  # byte for byte
    column.nth(word).click()  # the web app explains the word's first token (/api/explain names tokens)
    page.wait_for_function("() => document.getElementById('sv-explain').textContent.includes('layer 2')")
    assert page.explained[-1]["token"] == first and page.explained[-1]["layer"] == 2  # type: ignore[attr-defined]
    text = lazy["words"]["tokens"][word]  # a whole word, e.g. "unforgettable" (pieces "un", "##forget", ...)
    assert f">{word}: {text}</text>" in page.evaluate(FIGURE) and len(text) > len(lazy["tokens"][piece])  # the figure
    for view in ("matrix", "model"):  # the page draws another view (serve.js's view menu): still words
        page.evaluate(DRAW, [view, shown(page, "({layer: s.state().layer, head: s.state().head, "
                                                 "query: s.state().query})")])
        assert shown(page, "[s.view(), s.model.n, s.state().query]") == [view, 156, word]
        if view == "matrix":
            page.wait_for_function("() => document.querySelector('.as-panel').textContent.includes('of 156 × 156')")
    assert page.locator(".as-panel .as-thumb").count() == 6 * 12  # from the word overviews
    assert all("layer=2" in u for u in word_requests(page))  # no other layer fetched for the thumbnails
    page.click(".as-words")  # words -> tokens: the word's first token
    page.wait_for_function(f"() => {SHOWN}.model.n === 310")
    assert shown(page, "[s.view(), s.state().layer, s.state().head, s.state().query]") == ["model", 2, 3, first]
    assert page.get_attribute(".as-words", "aria-pressed") == "false"
    assert "12 heads · 310 tokens ·" in page.text_content(".as-meta")
    page.evaluate(DRAW, ["head", {"layer": 2, "head": 3}])
    assert f": {text}</text>" not in page.evaluate(FIGURE)  # tokens again: its pieces


def test_words_payload_is_bounded_and_says_why_when_over(local: Trace, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over WORDS_UP_FRONT map values the payload carries no words payload (its merge would cost seconds) and
    says why; under it, the words payload's scales are the word maps' own (here in process, no server)."""
    from attnscope.serve import wordmaps
    from attnscope.serve.maps import compact

    kept = compact(local, ["weights"], ("all-MiniLM-L6-v2", TEXT, None, 512, True))
    base = {"sources": [{"name": "weights", "shape": [6, 12, 310, 310]}], "maps": {"url": "u"}, "initial": {}}
    p = dict(base)
    wordmaps.add_words(p, kept, local)
    bound = (words_of(local).pieces.max() * kept.sources["weights"].scales[5, 11] + 1) / 510  # s_w <= 1
    assert p["word_level"]["toggle"] and p["words"]["sources"][0]["scales"][12 * 5 + 11] == pytest.approx(
        word_trace(local).arrays["weights"][5, 11].max(), abs=bound)
    monkeypatch.setattr(wordmaps, "WORDS_UP_FRONT", 6 * 12 * 310 * 310 - 1)
    p = dict(base)
    wordmaps.add_words(p, kept, local)
    assert "words" not in p and p["word_level"]["available"] and not p["word_level"]["toggle"]
    assert p["word_level"]["reason"].startswith(f"the trace holds {6 * 12 * 310 * 310} map values, over the")
    assert len(p["word_level"]["words"]) == 156  # the word list is there all the same
