"""POST /api/attribute (serve/attribute.py) on a real server on loopback (uvicorn, MiniLM and SmolLM2): the scores
equal the library's, the answer carries the view's payload, and bad input, a method that does not apply, a text
over max_length and a job too costly for the deadline are one-line 422s (never a 500)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest

import attnscope
from attnscope.attribution import attribute
from attnscope.attribution.methods import METHODS
from attnscope.attribution.objective import build_objective
from attnscope.errors import AttnscopeError
from attnscope.serve.attribute import RESPONSE_SCHEMA, admit, attribute_fields, forward_rows
from attnscope.serve.attribute import routes as attribute_routes
from attnscope.serve.fields import body_schema
from attnscope.serve.settings import Settings
from attnscope.views.attribution import attribution_payload

TEXT = "The cat sat on the mat."


@dataclass
class Running:
    url: str
    server: Any
    thread: threading.Thread

    def post(self, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(self.url + "/api/attribute", json=body, timeout=120)


@pytest.fixture(scope="module")
def server() -> Iterator[Running]:
    """The web app with POST /api/attribute (added here unless app.py already routes it), served by uvicorn on
    127.0.0.1 in a thread of this process."""
    import uvicorn
    from starlette.routing import Route

    from attnscope.serve.app import create_app

    settings = Settings(models=("minilm", "smollm2"), max_tokens=64)
    app = create_app(settings)
    if not any(isinstance(r, Route) and r.path == "/api/attribute" for r in app.router.routes):
        s = app.state.server
        app.router.routes[1:1] = attribute_routes(settings, s.service, s._run,
                                                  attribute_fields(settings, s.service.names))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not uv.started:
        time.sleep(0.1)
    assert httpx.get(url + "/healthz", timeout=10).status_code == 200
    yield Running(url, uv, thread)
    uv.should_exit = True
    thread.join(timeout=30)
    sock.close()


def test_answer_equals_the_library_and_carries_the_view(server: Running, minilm: attnscope.Model) -> None:
    r = server.post({"text": TEXT, "methods": "attention,rollout,leave_one_out"})
    assert r.status_code == 200, r.text
    body = r.json()
    direct = attribute(TEXT, model=minilm, methods="attention,rollout,leave_one_out")
    assert set(RESPONSE_SCHEMA["required"]) <= set(body)
    assert body["kind"] == "encoder" and body["targets"] == direct.targets and body["status"] == "PASS"
    assert [t["text"] for t in body["tokens"]] == [t.text for t in direct.tokens]
    for name, ms in direct.methods.items():
        got = np.array(body["methods"][name]["scores"], dtype=np.float64)
        assert np.abs(got - ms.scores).max() <= 1e-6, name  # the same forward on the same model
        assert body["methods"][name]["check"]["status"] == ms.check.status
    view = body["view"]
    want = attribution_payload(direct)
    assert view["tokens"] == want["tokens"] and [m["name"] for m in view["methods"]] == list(direct.methods)
    for m in view["methods"]:
        assert m["scores"] == body["methods"][m["name"]]["scores"]  # the view's numbers are the answer's


def test_a_causal_lm_explains_its_target(server: Running) -> None:
    r = server.post({"text": "The capital of France is", "model": "smollm2", "target": " Paris",
                     "methods": "attention,saliency", "raw_tokens": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["kind"] == "causal" and body["targets"] == [" Paris"] and "Paris" in body["description"]
    assert body["view"]["raw_tokens"] is True and "Ġcapital" in body["view"]["tokens"]
    assert body["methods"]["saliency"]["check"]["status"] == "PASS"
    assert len(body["view"]["agreement"][0]["rho"]) == 2


@pytest.mark.parametrize(("body", "message"), [
    ({"text": TEXT, "methods": "magic"}, "unknown attribution method 'magic'"),
    ({"text": TEXT, "methods": "saliency"}, "saliency does not apply to all-MiniLM-L6-v2"),
    ({"text": TEXT, "methods": " "}, "is empty: name methods"),
    ({"text": TEXT, "target": ""}, "field 'target' is empty"),
    ({"text": TEXT, "ig_tolerance": 2}, "field 'ig_tolerance' must be above 0 and at most 0.5"),
    ({"text": TEXT, "ig_steps": 0}, "field 'ig_steps' must be from 1"),
    ({"text": TEXT, "methods": "integrated_gradients", "ig_steps": 64, "ig_max_steps": 32},
     "ig_steps=64 is more than the step cap, 32"),
    ({"text": TEXT, "layer": -1}, "field 'layer' must be from 0"),
    ({"text": TEXT, "max_length": 4, "methods": "attention"}, "max_length"),
    ({"text": TEXT, "methods": "attention", "colour": "red"}, "unknown field 'colour'"),
    ({"text": "The capital of France is", "model": "smollm2", "target": " Paris", "ig_steps": 512,
      "methods": "integrated_gradients,leave_one_out"}, "forward passes of"),
])
def test_refusals_are_one_line_422s(server: Running, body: dict[str, Any], message: str) -> None:
    r = server.post(body)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert message in error and "\n" not in error


def test_the_server_still_answers_after_refusals(server: Running) -> None:
    assert server.post({"text": TEXT, "methods": "magic"}).status_code == 422
    assert server.post({"text": TEXT, "methods": "attention"}).status_code == 200


def test_admission_counts_each_methods_forwards(minilm: attnscope.Model) -> None:
    obj = build_objective(minilm, TEXT)
    n = obj.n_tokens
    assert forward_rows("leave_one_out", obj, 32) == n + 1
    assert forward_rows("integrated_gradients", obj, 32) == 32 * 3 + 1
    assert forward_rows("rollout", obj, 32) == 1
    methods = [METHODS["leave_one_out"], METHODS["integrated_gradients"]]
    admit(methods, obj, 32, row_seconds=0.001, deadline=time.monotonic() + 60)  # 107 x 1 ms: admitted
    with pytest.raises(AttnscopeError, match=r"about 107 forward passes of 9 tokens \(integrated_gradients ~97, "
                                             r"leave_one_out ~10\), about 11 s") as caught:
        admit(methods, obj, 32, row_seconds=0.1, deadline=time.monotonic() + 5)
    assert caught.value.parameter == "methods"


def test_the_fields_are_the_schema() -> None:
    schema = body_schema(attribute_fields(Settings(), ["all-MiniLM-L6-v2"]))
    assert schema["required"] == ["text"] and schema["additionalProperties"] is False
    assert schema["properties"]["ig_tolerance"]["exclusiveMinimum"] is True
    assert schema["properties"]["model"]["enum"] == ["all-MiniLM-L6-v2", None]


@pytest.mark.parametrize("body", [
    {"text": TEXT, "methods": "attention", "layer": 2**64},
    {"text": TEXT, "methods": "attention", "head": 10**18},
    {"text": TEXT, "methods": "rollout", "layer": 5},
    {"text": "The capital of France is", "model": "smollm2", "methods": "integrated_gradients", "ig_steps": 8,
     "ig_max_steps": 2},
    {"text": "The capital of France is", "model": "smollm2", "target": "٣²", "methods": "attention"},
    {"text": "²٣ \u2028 -0.0 1e308", "methods": "attention,leave_one_out"},
    {"text": TEXT, "methods": ","},
    {"text": TEXT, "methods": "attention,attention"},
    {"text": TEXT, "target": " Paris", "methods": "attention"},
    {"text": TEXT, "ig_tolerance": 5e-324, "methods": "integrated_gradients", "ig_max_steps": 4},
])
def test_odd_input_is_answered_or_refused_never_a_500(server: Running, body: dict[str, Any]) -> None:
    r = server.post(body)
    assert r.status_code in (200, 422), r.text
    if r.status_code == 422:
        assert "\n" not in r.json()["error"]


@pytest.mark.parametrize(("model", "encoder"), [("smollm2", False), ("minilm", True)])
def test_a_heads_link_scores_the_input_by_that_head(server: Running, model: str, encoder: bool,
                                                    minilm: attnscope.Model, smollm2: attnscope.Model) -> None:
    """attribution.js's headAttributionBody (a head picked in the attention views, layer 2 head 3) posted as it is:
    the head's own attention weights from the predicting position (SmolLM2: the last token's row; MiniLM: the mean
    row, the encoder's pooled objective), equal to the trace's within float32's 1e-6."""
    from attnscope.views.attribution import page_html
    from attnscope.views.browser import chromium

    text = "The capital of France is"
    with chromium() as browser:
        page = browser.new_page()
        page.set_content(page_html({"format": "none"}, "head link"), wait_until="domcontentloaded")
        body = page.evaluate("([t, m, e]) => window.attnscope.headAttributionBody({text: t, model: m}, 2, 3, e)",
                             [text, model, encoder])
    assert body == {"text": text, "model": model, "target": None, "layer": 2, "head": 3,
                    "methods": "attention" if encoder else "attention,attention_x_gradient"}
    r = server.post(body)
    assert r.status_code == 200, r.text
    weights = attnscope.trace(text, model=minilm if encoder else smollm2).weights[2, 3]  # [query, key]
    want = weights.mean(axis=0) if encoder else weights[-1]
    got = np.array(r.json()["methods"]["attention"]["scores"][0])
    assert np.abs(got - want).max() <= 1e-6
    assert r.json()["methods"]["attention"]["settings"] == {"layer": 2, "head": 3}
