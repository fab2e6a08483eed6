"""POST /api/trace on an encoder-decoder model: text is the source, `target` the decoder's text (null: generated);
the answer holds each kind's tokens, check and arrays; a target for another model is 422 in one line. And the page.

The real app serving a random-weight T5 (tests/support/seq2seq.py) and the bundled MiniLM: in process with
starlette's TestClient for the API, under uvicorn on a loopback port (as `attnscope serve` runs it) for the page
in headless Chromium.
"""

from __future__ import annotations

import base64
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import uvicorn
from starlette.testclient import TestClient

import attnscope
from attnscope.serve.app import create_app
from attnscope.serve.settings import Settings

SOURCE, TARGET = "the cat sat on the mat", "die katze sass"


@pytest.fixture(scope="module")
def client(t5_dir: str) -> Iterator[TestClient]:
    # threads=None: an app made in this process must not set pytest's torch threads (later tests compare
    # in-process numbers with subprocesses that run on torch's default threads)
    app = create_app(Settings(models=(t5_dir, "all-MiniLM-L6-v2"), max_tokens=32, threads=None))
    with TestClient(app, base_url="http://127.0.0.1") as c:
        yield c


def _array(a: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(a["data"]), dtype="<f4").reshape(a["shape"])


def test_a_target_traces_the_three_kinds(client: TestClient, t5_dir: str) -> None:
    r = client.post("/api/trace", json={"text": SOURCE, "target": TARGET, "stages": ["weights", "k"],
                                        "payload": True})
    assert r.status_code == 200, r.text
    data = r.json()
    ed = attnscope.trace_seq2seq(SOURCE, TARGET, model=attnscope.load_model(t5_dir))
    assert data["status"] == "PASS" and not data["generated"] and data["target"] == TARGET
    assert list(data["kinds"]) == ["encoder", "decoder", "cross"]
    for kind, got in data["kinds"].items():
        t = ed.attention(kind)
        assert [x["text"] for x in got["tokens"]] == t.token_strings
        assert [x["text"] for x in got["key_tokens"]] == [x.text for x in t.keys]
        assert got["check"]["status"] == "PASS" and got["check"]["max_error"] <= 1e-5
        assert np.array_equal(_array(got["arrays"]["weights"]), t.weights)  # float32 bit for bit
        assert np.array_equal(_array(got["arrays"]["k"]), t.arrays["k"])
    assert _array(data["kinds"]["cross"]["arrays"]["weights"]).shape == (2, 4, 7, 8)  # [layer, head, target, source]
    assert data["payload"]["attention"] == "cross" and set(data["payload"]["kinds"]) == {"encoder", "decoder", "cross"}


def test_no_target_generates_one(client: TestClient) -> None:
    data = client.post("/api/trace", json={"text": SOURCE}).json()
    assert data["generated"] and data["status"] == "PASS" and len(data["kinds"]["cross"]["key_tokens"]) == 8


@pytest.mark.parametrize(("body", "words"), [
    ({"text": SOURCE, "target": TARGET, "model": "all-MiniLM-L6-v2"}, "target is for encoder-decoder models"),
    ({"text": SOURCE, "target": " "}, "field 'target' is empty"),
    ({"text": SOURCE, "target": TARGET, "maps": "lazy"}, "maps: not available for an encoder-decoder"),
    ({"text": SOURCE, "target": TARGET, "stages": ["rollout"]}, "cross-attention's [target, source] maps"),
])
def test_bad_requests_are_422_one_line(client: TestClient, body: dict[str, Any], words: str) -> None:
    r = client.post("/api/trace", json=body)
    assert r.status_code == 422 and words in r.json()["error"] and "\n" not in r.json()["error"]


def test_the_schema_documents_target(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    assert "Encoder-decoder models (T5, BART, Marian): the target" in str(schema["paths"]["/api/trace"])


@contextmanager
def serving(settings: Settings) -> Iterator[str]:
    """The real app under uvicorn on a free loopback port, in this process (its models are loaded already)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(settings), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started and thread.is_alive():
            time.sleep(0.05)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()


def test_the_page_asks_an_encoder_decoder_model_for_a_target(t5_dir: str) -> None:
    """The page in headless Chromium against the real app: with the T5 chosen the pair field gives way to a target
    field; the trace shows the encoder / decoder / cross selector; with MiniLM chosen the pair field is back."""
    from attnscope.views.browser import chromium

    errors: list[str] = []
    settings = Settings(models=(t5_dir, "all-MiniLM-L6-v2"), max_tokens=32, threads=None)
    with serving(settings) as url, chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url)
        page.wait_for_selector("#sv-status[data-kind=ok]", timeout=60_000)  # the default text, target generated
        assert page.is_visible("#sv-target") and not page.is_visible("#sv-pair")
        assert "(generated)" in page.inner_text("#sv-status")
        page.fill("#sv-text", SOURCE)
        page.fill("#sv-target", TARGET)
        page.click("#sv-go")
        page.wait_for_function("() => document.getElementById('sv-status').textContent.includes('8 source')")
        status = page.inner_text("#sv-status")
        assert "8 source → 7 target tokens · PASS" in status, status
        options = page.eval_on_selector_all("select.as-attention option", "os => os.map(o => o.textContent)")
        assert "cross-attention (target -> source)" in options
        page.select_option("#sv-model", "all-MiniLM-L6-v2")
        assert page.is_visible("#sv-pair") and not page.is_visible("#sv-target")
        assert not errors, errors
