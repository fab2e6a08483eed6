"""Each finding of the hardening probe (issue 17), replayed against a real `attnscope serve` on loopback.

No 500 for any input, the token limit a pair cannot bypass, deadlines for headers and bodies, a cap on
connections, response budgets, a cache that counts what it holds, work dropped for a client that left, and
a memory ceiling that /healthz reports.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.serve.test_serve_limits import SLOW, slow_text, wait_for
from tests.support.serve import Server, start_server

HEADER_S = 1.0  # the tight server's header and body deadlines
CONNECTIONS = 6
LIST_VALUES = 300_000  # more than one layer-head-token array of 62 tokens (6 x 12 x 62 x 62), less than three
CACHE_MIB = 7  # holds one 60-token trace (~5 MiB of arrays), not the same with its derived arrays and payload
RESPONSE_MIB = 4


@pytest.fixture(scope="module")
def tight() -> Iterator[Server]:
    s = start_server("--workers", "1", "--queue", "4", "--max-tokens", "64", "--header-timeout", str(HEADER_S),
                     "--body-timeout", str(HEADER_S), "--max-connections", str(CONNECTIONS),
                     "--max-response", str(RESPONSE_MIB), "--max-list", str(LIST_VALUES), "--cache-size",
                     str(CACHE_MIB), "--cache", "8")
    yield s
    assert s.stop() == 0
    assert "Traceback" not in "".join(s.stderr), "".join(s.stderr)[-4000:]


def post(server: Server, path: str, body: Any) -> httpx.Response:
    with server.client() as c:
        return c.post(path, json=body)


def test_explain_after_attention_flow_is_200(server: Server) -> None:
    """Flow is [query, key]: the walkthrough indexed it by layer (IndexError, 500, for a layer >= the tokens)."""
    text = "Flow first."
    assert post(server, "/api/trace", {"text": text, "stages": ["flow"]}).status_code == 200
    n = len(post(server, "/api/trace", {"text": text, "stages": []}).json()["tokens"])
    assert n < 6  # fewer tokens than layers: layer 5 is past the flow array's first axis
    for layer in (n - 1, 5):
        r = post(server, "/api/explain", {"text": text, "layer": layer, "head": 0})
        assert r.status_code == 200, r.text[:300]
        assert r.json()["layer"] == layer


@pytest.mark.parametrize("words", [508, 700])
def test_a_pair_cannot_bypass_the_token_limit(server: Server, words: int) -> None:
    body = {"text": " ".join(["a"] * words), "pair": "b", "max_length": 2, "stages": []}
    probe = post(server, "/api/trace", body)  # the probe's request: below any text's special tokens
    assert probe.status_code == 422 and "field 'max_length' must be from 3" in probe.json()["error"]
    refused = post(server, "/api/trace", {**body, "max_length": 4})  # enough for one text, not for a pair
    assert refused.status_code == 422, refused.text[:300]
    assert refused.json()["error"] == ("max_length 4 is too small: a text and its pair need 3 special tokens and at "
                                       "least one token of each text: use at least 5")
    kept = post(server, "/api/trace", {**body, "max_length": 5})
    assert kept.status_code == 200 and len(kept.json()["tokens"]) == 5


def test_a_500_says_only_internal_error_and_a_request_id() -> None:
    """The guard around a real Starlette app whose endpoint fails: the client never reads the exception."""
    import asyncio

    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.routing import Route

    from attnscope.serve.guard import Guard
    from attnscope.serve.settings import Settings

    async def broken(_request: Any) -> Any:
        raise IndexError("index 5 is out of bounds for axis 0 with size 4 (a secret path /home/x)")

    app = Starlette(routes=[Route("/boom", broken)], middleware=[Middleware(Guard, settings=Settings())])

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as c:
            return await c.get("/boom")

    r = asyncio.run(call())
    rid = r.headers["x-request-id"]
    assert r.status_code == 500 and r.json() == {"error": f"internal error (request id {rid})"}


def test_a_response_over_the_budget_never_leaves() -> None:
    """Every endpoint, also one added later, is held to max_response_bytes by the guard (a 500, or a cut stream)."""
    import asyncio

    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    from attnscope.serve.guard import Guard
    from attnscope.serve.settings import Settings

    async def chunks() -> Any:
        for _ in range(4):
            yield b"y" * 600

    async def big(_request: Any) -> Any:
        return PlainTextResponse("x" * 2000)

    async def stream(_request: Any) -> Any:
        return StreamingResponse(chunks())

    app = Starlette(routes=[Route("/big", big), Route("/stream", stream)],
                    middleware=[Middleware(Guard, settings=Settings(max_response_bytes=1024))])

    async def call(path: str) -> tuple[int, bytes]:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as c:
            r = await c.get(path)
            return r.status_code, r.content

    status, body = asyncio.run(call("/big"))
    assert status == 500 and body.startswith(b'{"error":"internal error (request id ')

    async def stream_call() -> list[dict[str, Any]]:  # the ASGI messages the server would write
        sent: list[dict[str, Any]] = []
        scope = {"type": "http", "method": "GET", "path": "/stream", "raw_path": b"/stream", "query_string": b"",
                 "headers": [(b"host", b"127.0.0.1:8000")], "server": ("127.0.0.1", 8000), "scheme": "http",
                 "http_version": "1.1", "root_path": "", "client": ("127.0.0.1", 5000)}

        requested = False

        async def receive() -> dict[str, Any]:  # the request once, then a client that stays
            nonlocal requested
            if requested:
                await asyncio.Event().wait()
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(scope, receive, send)
        return sent

    messages = asyncio.run(stream_call())
    bodies = [m for m in messages if m["type"] == "http.response.body"]
    assert sum(len(m.get("body", b"")) for m in bodies) <= 1024
    assert all(m.get("more_body", False) for m in bodies)  # never completed: the client sees a cut stream


def raw(server: Server, data: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(data)
    return sock


def closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """(whether the server closed the connection within `seconds`, what it sent before)."""
    sock.settimeout(seconds)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
        return True, got
    except TimeoutError:
        return False, got
    finally:
        sock.close()


def test_headers_sent_slowly_are_cut_off(tight: Server) -> None:
    sock = raw(tight, b"POST /api/trace HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    for _ in range(3):  # a byte a second never finishes the headers
        time.sleep(HEADER_S / 2)
        try:
            sock.sendall(b"X")
        except OSError:
            break
    closed, _ = closed_within(sock, HEADER_S * 4)
    assert closed


def test_a_body_sent_slowly_is_408(tight: Server) -> None:
    head = (f"POST /api/trace HTTP/1.1\r\nHost: 127.0.0.1:{tight.port}\r\nContent-Type: application/json\r\n"
            "Content-Length: 100\r\n\r\n").encode()
    sock = raw(tight, head + b'{"text": ')
    closed, got = closed_within(sock, HEADER_S * 6)
    assert closed and got.startswith(b"HTTP/1.1 408"), got[:200]
    assert b"did not arrive within" in got


def test_connections_are_capped_and_idle_ones_expire(tight: Server) -> None:
    idle = [raw(tight, b"GET / HTTP/1.1\r\n") for _ in range(CONNECTIONS - 1)]
    try:
        time.sleep(0.2)
        refused = httpx.get(tight.url + "healthz", timeout=10)
        assert refused.status_code == 503
    finally:
        time.sleep(HEADER_S * 1.5)  # the header deadline closes the idle connections
        for s in idle:
            s.close()
    assert httpx.get(tight.url + "healthz", timeout=10).status_code == 200


def test_large_list_responses_are_refused_naming_the_limit(tight: Server) -> None:
    every = ["x", "q", "k", "v", "scores", "weights", "context", "output", "norm_head", "norm_layer", "rollout"]
    text = " ".join(["word"] * 60)
    r = post(tight, "/api/trace", {"text": text, "stages": every, "encoding": "list"})
    assert r.status_code == 422
    assert f"encoding 'list' is limited to {LIST_VALUES} numbers" in r.json()["error"]
    big = post(tight, "/api/trace", {"text": text, "stages": every})  # base64: over the response limit
    assert big.status_code == 422 and f"over the server's limit of {RESPONSE_MIB} MiB" in big.json()["error"]
    assert post(tight, "/api/trace", {"text": "Short.", "stages": every, "encoding": "list"}).status_code == 200


def test_the_cache_counts_derived_arrays_and_payloads(tight: Server) -> None:
    for i in range(3):
        text = f"Text {i} " + " ".join(["word"] * 56)
        for _ in range(2):  # a one-off trace is kept the second time its text is asked for
            assert post(tight, "/api/trace", {"text": text, "stages": []}).status_code == 200
        assert 0 < tight.health()["cache"]["bytes"] <= CACHE_MIB * 2**20  # the trace alone fits
        r = post(tight, "/api/trace", {"text": text, "stages": [], "payload": True,
                                       "sources": ["norm_head", "norm_layer", "rollout"]})
        assert r.status_code == 200, r.text[:200]
        cache = tight.health()["cache"]
        assert cache["bytes"] <= cache["max_bytes"] == CACHE_MIB * 2**20, cache
    assert tight.health()["cache"]["evicted"] > 0


def test_work_for_a_client_that_left_is_not_started(tight: Server) -> None:
    before = tight.health()["pool"]["dropped"]
    first: dict[str, httpx.Response] = {}

    def run_first() -> None:
        with tight.client() as c:
            first["r"] = c.post("/api/trace", json={"text": slow_text("kept"), **SLOW})

    a = threading.Thread(target=run_first)
    a.start()
    wait_for(tight, 1)
    body = json.dumps({"text": slow_text("abandoned"), **SLOW}).encode()
    head = (f"POST /api/trace HTTP/1.1\r\nHost: 127.0.0.1:{tight.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    leaver = raw(tight, head + body)
    wait_for(tight, 2)
    leaver.close()  # hangs up while queued behind the first
    wait_for(tight, 1, limit_s=5)  # dropped at once, while the first still runs
    assert a.is_alive() or first["r"].status_code == 200
    a.join()
    assert first["r"].status_code == 200
    assert tight.health()["pool"]["dropped"] == before + 1


def test_healthz_reports_memory_and_a_ceiling_refuses_work() -> None:
    s = start_server("--max-memory", "1", "--max-tokens", "16")
    try:
        health = httpx.get(s.url + "healthz", timeout=10)
        assert health.status_code == 503
        memory = health.json()["memory"]
        assert memory["max"] == 2**20 and memory["rss"] > memory["max"] and memory["ok"] is False
        assert health.json()["status"] == "over the memory ceiling"
        r = httpx.post(s.url + "api/trace", json={"text": "hello"}, timeout=60)
        assert r.status_code == 503 and "over its memory ceiling" in r.json()["error"]
    finally:
        assert s.stop() == 0
