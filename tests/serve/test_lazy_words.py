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
from serve_support import Server

import attnscope
from attnscope.serve import binary
from attnscope.serve.maps import WordLevel, overview
from attnscope.serve.wordmaps import from_codes
from attnscope.traces import Trace
from attnscope.views.words import merge, word_groups, word_trace

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
    assert np.array_equal(pooled.reshape(6, 12, *o["shape"])[4], overview(codes))


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
