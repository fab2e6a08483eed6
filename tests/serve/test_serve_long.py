"""Long traces in the web app (issue 16): a payload without maps, then `GET /api/trace/{id}/map` per map, on a real
server. The uint8 maps are the inline payload's codes byte for byte, float32 the trace's bit for bit; every bad
request is one line (422/404), never a 500."""

from __future__ import annotations

import base64
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

import attnscope
from attnscope.serve import binary
from attnscope.serve.binary import quantize_maps
from attnscope.serve.maps import LAZY_FROM, OVERVIEW
from attnscope.serve.quantize import overview
from attnscope.views.payload import quantize
from tests.support.serve import Server, decode

TEXT = "The old lighthouse keeper watched the storm roll in across the bay, counting waves."


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def traced(http: httpx.Client, maps: str, **extra: Any) -> dict[str, Any]:
    r = http.post("/api/trace", json={"text": TEXT, "stages": [], "payload": True, "maps": maps, **extra})
    assert r.status_code == 200, r.text
    return dict(r.json())


@pytest.fixture(scope="module")
def lazy(http: httpx.Client) -> dict[str, Any]:
    return traced(http, "lazy", sources=["rollout"])["payload"]


@pytest.fixture(scope="module")
def inline(http: httpx.Client) -> dict[str, Any]:
    return traced(http, "inline", sources=["rollout"])["payload"]


def codes_of(source: dict[str, Any]) -> np.ndarray:
    """An inline payload's source -> its uint8 codes [layer, head, query, key]."""
    raw = base64.b64decode(source["data"])
    return np.frombuffer(zlib.decompress(raw) if source["encoding"].endswith("+zlib") else raw,
                         dtype=np.uint8).reshape(source["shape"])


def fetch(http: httpx.Client, url: str, **params: Any) -> tuple[dict[str, Any], np.ndarray, httpx.Response]:
    r = http.get(url, params=params)
    assert r.status_code == 200 and r.headers["content-type"] == binary.MEDIA_TYPE, r.text
    header, arrays = binary.decode(r.content)
    return header, next(iter(arrays.values())), r


def raw_codes(r: httpx.Response) -> np.ndarray:
    """The uint8 codes as sent (binary.decode turns them into values)."""
    header, _ = binary.decode(r.content)
    spec = next(iter(header["arrays"].values()))
    start = len(r.content) - sum(s["nbytes"] + -s["nbytes"] % 8 for s in header["arrays"].values())
    return np.frombuffer(r.content[start + spec["offset"]:][:spec["nbytes"]], dtype=np.uint8).reshape(spec["shape"])


def test_lazy_payload_carries_summaries_not_maps(lazy: dict[str, Any], inline: dict[str, Any]) -> None:
    assert [s["name"] for s in lazy["sources"]] == [s["name"] for s in inline["sources"]] == ["weights", "rollout"]
    for small, full in zip(lazy["sources"], inline["sources"], strict=True):
        assert small["data"] is None and small["encoding"] == "lazy"
        assert small["scales"] == full["scales"] and small["shape"] == full["shape"]  # the same per-map maxima
        view = small["overview"]
        pooled = np.frombuffer(zlib.decompress(base64.b64decode(view["data"])), dtype=np.uint8)
        assert np.array_equal(pooled.reshape(*full["shape"][:2], *view["shape"]), overview(codes_of(full), OVERVIEW))
    assert lazy["tokens"] == inline["tokens"] and lazy["check"] == inline["check"]
    assert lazy["maps"]["url"] == f"/api/trace/{lazy['maps']['trace']}/map" and lazy["maps"]["stored"]
    assert lazy["neuron"] == {"blocks": [], "complete": False, "available": True}  # on request: /api/neuron


def test_uint8_maps_are_the_inline_codes_byte_for_byte(http: httpx.Client, lazy: dict[str, Any],
                                                       inline: dict[str, Any]) -> None:
    codes = codes_of(inline["sources"][0])  # weights [layer, head, query, key]
    url = lazy["maps"]["url"]
    header, _, r = fetch(http, url, layer=3, head=7)
    assert (header["layer"], header["head"], header["n_query"], header["n_key"]) == (3, 7, *codes.shape[2:])
    assert np.array_equal(raw_codes(r), codes[3, 7]) and header["arrays"]["weights"]["scales"] == [
        inline["sources"][0]["scales"][3 * codes.shape[1] + 7]]
    _, _, whole = fetch(http, url, layer=5)  # every head of a layer in one body: [head, query, key]
    assert np.array_equal(raw_codes(whole), codes[5])
    _, _, rollout = fetch(http, url, source="rollout", layer=2)  # [layer, query, key]: no head axis
    assert np.array_equal(raw_codes(rollout), codes_of(inline["sources"][1])[2, 0])


def test_float32_maps_are_the_trace_bit_for_bit(http: httpx.Client, lazy: dict[str, Any],
                                                minilm: attnscope.Model) -> None:
    header, exact, _ = fetch(http, lazy["maps"]["url"], layer=1, head=4, precision="float32")
    sent = http.post("/api/trace", json={"text": TEXT, "stages": ["weights"]}).json()["arrays"]["weights"]
    assert exact.dtype == np.float32 and exact.tobytes() == decode(sent)[1, 4].tobytes()
    local = attnscope.trace(TEXT, model=minilm, max_length=len(lazy["tokens"]))
    assert np.abs(exact - local.weights[1, 4]).max() <= 1e-5 and header["check_ok"] is True
    _, half, _ = fetch(http, lazy["maps"]["url"], layer=1, head=4, precision="float16")
    assert half.tobytes() == exact.astype(np.float16).tobytes()


@pytest.mark.parametrize(("params", "words"), [
    ({"layer": 6, "head": 0}, "layer 6 is out of range: this trace has 6 layers, valid values are 0..5"),
    ({"layer": 0, "head": 12}, "head 12 is out of range"),
    ({"layer": "-1"}, "parameter 'layer' must be a whole number from 0 to 5"),
    ({"layer": "1e3"}, "must be a whole number"),
    ({}, "parameter 'layer' is required"),
    ({"layer": 0, "precision": "int4"}, "precision 'int4' is not known"),
    ({"layer": 0, "source": "flow"}, "source 'flow' is not in this trace: it has weights, rollout"),
    ({"layer": 0, "query": 3}, "unknown parameter 'query'"),
    ({"layer": 0, "source": "rollout", "head": 1}, "source 'rollout' has no heads: leave out parameter 'head'"),
])
def test_bad_selections_are_one_line_422(http: httpx.Client, lazy: dict[str, Any], params: dict[str, Any],
                                         words: str) -> None:
    r = http.get(lazy["maps"]["url"], params=params)
    assert r.status_code == 422 and words in r.json()["error"] and "\n" not in r.json()["error"]


def test_a_trace_the_server_does_not_have_is_404(http: httpx.Client) -> None:
    for trace in ("0123456789abcdef", "x" * 300, "%2e%2e"):
        r = http.get(f"/api/trace/{trace}/map", params={"layer": 0})
        assert r.status_code == 404 and "trace the text again" in r.json()["error"]


def test_asking_again_is_answered_from_the_store(http: httpx.Client, server: Server) -> None:
    first = traced(http, "lazy")
    before = server.health()
    again = traced(http, "lazy")
    after = server.health()
    assert again == first and after["maps"]["entries"] >= 1
    assert (after["cache"]["hits"], after["cache"]["misses"]) == (before["cache"]["hits"], before["cache"]["misses"])


def test_auto_goes_lazy_only_for_large_traces(http: httpx.Client, lazy: dict[str, Any]) -> None:
    n = len(lazy["tokens"])
    assert 6 * 12 * n * n <= LAZY_FROM  # this text is small: "auto" sends its maps inline
    assert traced(http, "auto")["payload"]["sources"][0]["encoding"].startswith("u8")
    r = http.post("/api/trace", json={"text": TEXT, "maps": "later"})
    assert r.status_code == 422 and "field 'maps' must be one of" in r.json()["error"]


def test_too_large_and_evicted(long_server: Server) -> None:
    long_text = " ".join([TEXT] * 40)  # truncated to 512 tokens: a layer's 12 heads as float32 are 12 MiB
    with long_server.client() as c:
        first = c.post("/api/trace", json={"text": long_text, "stages": [], "payload": True, "maps": "lazy"}).json()
        url = first["payload"]["maps"]["url"]
        r = c.get(url, params={"layer": 0, "precision": "float32"})
        assert r.status_code == 422 and "over the server's limit of 4 MiB: ask for one head" in r.json()["error"]
        assert c.get(url, params={"layer": 0, "head": 2, "precision": "float32"}).status_code == 200
        assert c.get(url, params={"layer": 0}).status_code == 200  # uint8: a quarter, under the limit
        for other in ("Another text.", "And a third one."):  # the server keeps two
            c.post("/api/trace", json={"text": other, "payload": True, "maps": "lazy"})
        r = c.get(url, params={"layer": 0, "head": 2})
        assert r.status_code == 404 and "no longer has trace" in r.json()["error"]

def test_the_servers_quantization_is_the_payloads_byte_for_byte(lazy: dict[str, Any]) -> None:
    rng = np.random.default_rng(16)
    maps = (rng.random((3, 4, 37, 41), dtype=np.float32) ** 6).astype(np.float32)  # many values near 0
    maps[0, 0] = 0  # an all-zero map: scale 0, codes 0
    maps[1, 2, 3, 4] = np.float32(1e-38)
    maps[2, 1] = np.float32(0.5) / 255 * np.arange(37 * 41, dtype=np.float32).reshape(37, 41) % 1  # .5 ties
    fast, slow = quantize_maps(maps), quantize(maps)
    assert fast[0].tobytes() == slow[0].tobytes() and np.array_equal(fast[1], slow[1])
