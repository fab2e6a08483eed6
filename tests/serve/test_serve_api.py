"""The JSON API of a real `attnscope serve` on loopback, compared with the library's own results."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

import attnscope
from attnscope.explain.from_trace import walkthrough
from attnscope.explain.render import walkthrough_json
from attnscope.stages import ARRAY_AXES, DERIVED
from attnscope.views import neuron_block
from tests.support.serve import MAX_BODY, MAX_CHARS, MAX_TOKENS, Server, decode

TOL = 1e-5
ROUNDING = re.compile(r"\d\.\de-\d\d")  # a measured float32 difference, e.g. 5.2e-08
TEXT = "The cat sat on the mat."
PAIR = "It was tired."


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


@pytest.fixture(scope="module")
def local(minilm: attnscope.Model) -> attnscope.Trace:
    """The same text traced in this process: what the server must reproduce."""
    return attnscope.trace(TEXT, PAIR, model=minilm, max_length=MAX_TOKENS)


def post(http: httpx.Client, path: str, body: Any) -> httpx.Response:
    return http.post(path, json=body)


def test_trace_returns_every_stage_by_its_saved_name(http: httpx.Client, local: attnscope.Trace) -> None:
    stages = ["x", "q", "k", "v", "scores", "weights", "context", "output", "norm_head", "norm_layer", "rollout"]
    r = post(http, "/api/trace", {"text": TEXT, "pair": PAIR, "stages": stages})
    assert r.status_code == 200, r.text
    data = r.json()
    assert [t["text"] for t in data["tokens"]] == local.token_strings
    assert [t["segment"] for t in data["tokens"]] == [t.segment for t in local.tokens]
    assert data["check"]["ok"] is True and data["check"]["max_error"] <= TOL
    assert set(data["arrays"]) == set(stages)
    local.rollout()
    local.norms()
    for name in stages:
        got = data["arrays"][name]
        assert got["axes"] == list(ARRAY_AXES[name])
        if name == "scores":  # the server's one torch thread blocks q k^T differently: the check's own measure
            assert relative_error(decode(got), local) <= TOL
        else:
            np.testing.assert_allclose(decode(got), local.arrays[name], rtol=0, atol=TOL, err_msg=name)


def relative_error(scores: np.ndarray, local: attnscope.Trace) -> float:
    """max |a - b| / max(1, |q| |k|) over [layer, head, query, key], as attnscope.verify.check measures scores."""
    q = np.linalg.norm(local.arrays["q"].astype(np.float64), axis=-1)  # [layer, head, query]
    k = np.linalg.norm(local.arrays["k"].astype(np.float64), axis=-1)  # [layer, head, key]
    bound = np.maximum(1.0, q[..., :, None] * k[..., None, :])  # [layer, head, query, key]
    return float(np.max(np.abs(scores.astype(np.float64) - local.arrays["scores"]) / bound))


def test_list_encoding_equals_base64(http: httpx.Client) -> None:
    a = post(http, "/api/trace", {"text": TEXT, "stages": ["weights", "q"], "encoding": "list"}).json()
    b = post(http, "/api/trace", {"text": TEXT, "stages": ["weights", "q"]}).json()
    for name in ("weights", "q"):
        assert a["arrays"][name]["encoding"] == "list" and b["arrays"][name]["encoding"] == "base64"
        np.testing.assert_array_equal(decode(a["arrays"][name]), decode(b["arrays"][name]))


def test_explain_is_the_cli_walkthrough(http: httpx.Client, local: attnscope.Trace,
                                        minilm: attnscope.Model) -> None:
    r = post(http, "/api/explain", {"text": TEXT, "pair": PAIR, "layer": 3, "head": 7, "token": 4})
    assert r.status_code == 200, r.text
    got = r.json()
    want = walkthrough_json(walkthrough(local, 3, 7, 4, model=minilm))
    assert (got["layer"], got["head"], got["token"]) == (3, 7, 4)
    assert got["tokens"] == json.loads(json.dumps(want["tokens"]))
    assert [s["stage"] for s in got["steps"]] == [s["stage"] for s in want["steps"]]
    for g, w in zip(got["steps"], want["steps"], strict=True):
        assert (g["title"], g["shape"]) == (w["title"], w["shape"])
        assert ROUNDING.sub("#", g["text"]) == ROUNDING.sub("#", w["text"])  # measured float32 differences vary
        assert list(g["arrays"]) == list(w["arrays"])
        for name in w["arrays"]:
            np.testing.assert_allclose(np.asarray(g["arrays"][name], dtype=np.float64),
                                       np.asarray(w["arrays"][name], dtype=np.float64),
                                       rtol=1e-6, atol=TOL, err_msg=f"{g['stage']}/{name}")
    assert got["check"]["ok"] is True and got["check"]["head_max_error"] <= TOL


def test_neuron_block_matches_the_trace(http: httpx.Client, local: attnscope.Trace) -> None:
    r = post(http, "/api/neuron", {"text": TEXT, "pair": PAIR, "layer": 5, "head": 11})
    assert r.status_code == 200, r.text
    got, want = r.json(), neuron_block(local, 5, 11)
    assert {k: got[k] for k in ("layer", "head", "d_head", "encoding")} == \
        {k: want[k] for k in ("layer", "head", "d_head", "encoding")}
    assert got["scaling"] == pytest.approx(want["scaling"], abs=1e-12)


def test_payload_is_the_views_payload_with_the_sources_asked_for(http: httpx.Client) -> None:
    plain = post(http, "/api/trace", {"text": TEXT, "stages": [], "payload": True}).json()
    every = ["norm_head", "norm_layer", "rollout", "flow"]
    more = post(http, "/api/trace", {"text": TEXT, "stages": [], "payload": True, "sources": every}).json()
    assert [s["name"] for s in plain["payload"]["sources"]] == ["weights"]
    assert {s["name"] for s in more["payload"]["sources"]} == {"weights", *every}
    assert plain["payload"]["tokens"] == [t["text"] for t in plain["tokens"]]
    assert plain["arrays"] == {}


def test_truncation_at_the_server_limit(http: httpx.Client) -> None:
    long = " ".join(["word"] * (MAX_TOKENS * 2))
    kept = post(http, "/api/trace", {"text": long, "stages": []}).json()
    assert kept["truncated"] is True and len(kept["tokens"]) == MAX_TOKENS
    refused = post(http, "/api/trace", {"text": long, "truncate": False})
    assert refused.status_code == 422
    assert f"over the maximum of {MAX_TOKENS}" in refused.json()["error"]


def test_models_health_and_schema(http: httpx.Client, minilm: attnscope.Model) -> None:
    models = http.get("/api/models").json()["models"]
    assert [(m["name"], m["layers"], m["heads"], m["default"]) for m in models] == \
        [(minilm.name, minilm.n_layers, minilm.n_heads, True)]
    assert models[0]["max_length"] == MAX_TOKENS
    health = http.get("/healthz").json()
    assert health["status"] == "ok" and health["pool"]["capacity"] == 66  # 2 workers + 64
    doc = http.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.0")
    assert set(doc["paths"]) == {"/api/trace", "/api/trace/{id}/map", "/api/explain", "/api/neuron", "/api/generate",
                                 "/api/ablate", "/api/patch", "/api/attribute", "/api/faithfulness",
                                 "/api/search", "/api/qkmap", "/api/heads", "/api/models",
                                 "/healthz"}  # every route but / and itself
    text = doc["paths"]["/api/trace"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert text["properties"]["text"]["maxLength"] == MAX_CHARS
    assert text["properties"]["max_length"]["maximum"] == MAX_TOKENS


def test_a_one_off_trace_is_kept_from_the_second_time_and_the_pages_at_once(http: httpx.Client) -> None:
    def cache() -> dict[str, int]:
        c: dict[str, int] = http.get("/healthz").json()["cache"]
        return c

    before = cache()
    assert post(http, "/api/trace", {"text": "Asked for once, by an API client."}).status_code == 200
    once = cache()
    assert (once["declined"] - before["declined"], once["misses"] - before["misses"]) == (1, 1)
    assert post(http, "/api/trace", {"text": "Asked for once, by an API client."}).status_code == 200
    twice = cache()  # traced again, and kept this time
    assert (twice["declined"], twice["misses"] - once["misses"], twice["hits"]) == (once["declined"], 1, once["hits"])
    assert post(http, "/api/trace", {"text": "Asked for once, by an API client."}).status_code == 200
    assert cache()["hits"] == twice["hits"] + 1
    page = {"text": "Shown on the page.", "stages": [], "payload": True}
    assert post(http, "/api/trace", page).status_code == 200  # the page asks again: kept at once
    assert post(http, "/api/explain", {"text": "Shown on the page.", "layer": 0, "head": 1}).status_code == 200
    after = cache()
    assert (after["declined"], after["hits"] - twice["hits"]) == (twice["declined"], 2)


def test_the_cache_serves_repeated_texts(http: httpx.Client) -> None:
    text = "Switching heads should not trace again."
    before = http.get("/healthz").json()["cache"]
    for head in range(4):
        assert post(http, "/api/explain", {"text": text, "layer": 1, "head": head, "token": 2}).status_code == 200
    after = http.get("/healthz").json()["cache"]
    assert after["misses"] - before["misses"] == 1
    assert after["hits"] - before["hits"] == 3


BAD_BODIES: list[tuple[str, Any, str]] = [
    ("/api/trace", {}, "field 'text' is required"),
    ("/api/trace", [], "must be a JSON object"),
    ("/api/trace", {"text": "   "}, "field 'text' is empty"),
    ("/api/trace", {"text": 5}, "field 'text' must be a string"),
    ("/api/trace", {"text": "a", "typo": 1}, "unknown field 'typo'"),
    ("/api/trace", {"text": "a", "max_length": MAX_TOKENS + 1}, f"must be from 3 to {MAX_TOKENS}"),
    ("/api/trace", {"text": "a", "max_length": True}, "must be an integer"),
    ("/api/trace", {"text": "a", "stages": ["weights", "attention"]}, "'attention'"),
    ("/api/trace", {"text": "a", "stages": ["q", "q"]}, "names an item twice"),
    ("/api/trace", {"text": "a", "model": "gpt2"}, "field 'model' must be one of"),
    ("/api/trace", {"text": "a", "encoding": "hex"}, "field 'encoding' must be one of"),
    ("/api/trace", {"text": "a" * (MAX_CHARS + 1)}, f"over the limit of {MAX_CHARS}"),
    ("/api/trace", {"text": "a", "sources": ["weights"]}, f"the choices are {', '.join(DERIVED)}"),
    ("/api/explain", {"text": "a", "layer": 6}, "must be from 0 to 5"),
    ("/api/explain", {"text": "a", "head": -1}, "must be from 0 to 11"),
    ("/api/explain", {"text": "two words", "token": 9}, "token 9 is out of range: this text has 4 tokens"),
    ("/api/explain", {"text": "a", "pair": ""}, "field 'pair' is empty"),
    ("/api/neuron", {"text": "a", "token": 1}, "unknown field 'token'"),
]


@pytest.mark.parametrize(("path", "body", "message"), BAD_BODIES)
def test_bad_fields_are_422_with_a_clear_line(http: httpx.Client, path: str, body: Any, message: str) -> None:
    r = post(http, path, body)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert message in error and "\n" not in error


@pytest.mark.parametrize("raw", [b"{", b"", b"\xff\xfe{}", b'{"text": NaN}', b"[" * 5000 + b"]" * 5000,
                                 b'{"text": "\\ud800"}'])
def test_broken_json_is_422(http: httpx.Client, raw: bytes) -> None:
    r = http.post("/api/trace", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["error"]


def test_a_large_body_is_413_declared_or_streamed(http: httpx.Client) -> None:
    big = json.dumps({"text": "a" * (MAX_BODY + 10)}).encode()
    declared = http.post("/api/trace", content=big, headers={"Content-Type": "application/json"})
    assert declared.status_code == 413 and f"limit of {MAX_BODY}" in declared.json()["error"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the server counts as it reads
        for i in range(0, len(big), 4096):
            yield big[i:i + 4096]

    streamed = http.post("/api/trace", content=chunks(), headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413 and "over the limit" in streamed.json()["error"]


def test_unknown_paths_and_methods_answer_json(http: httpx.Client) -> None:
    missing = http.get("/api/nothing")
    assert missing.status_code == 404 and missing.json() == {"error": "Not Found"}
    wrong = http.get("/api/trace")
    assert wrong.status_code == 405 and "POST" in wrong.headers["allow"]


def test_page_is_self_contained_with_a_strict_policy(http: httpx.Client) -> None:
    r = http.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    policy = r.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy and "unsafe-eval" not in policy
    assert "script-src 'sha256-" in policy and "'unsafe-inline'" not in policy.split("style-src")[0]
    for tag in ("<script src", "<link rel=\"stylesheet", "<img", "<iframe", "@import"):
        assert tag not in r.text
