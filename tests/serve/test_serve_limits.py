"""Limits of a real server with one worker and a one-request queue: 503 when full, 504 past the deadline."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.serve import Server, start_server

# Attention flow over ~60 tokens takes seconds (a max-flow per token pair): a request far past the deadline.
SLOW = {"stages": [], "payload": True, "sources": ["flow"]}
TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def tight() -> Iterator[Server]:
    s = start_server("--workers", "1", "--queue", "1", "--timeout", str(TIMEOUT_S), "--max-tokens", "64")
    yield s
    assert s.stop() == 0
    assert "Traceback" not in "".join(s.stderr), "".join(s.stderr)[-4000:]


def slow_text(tag: str) -> str:
    return f"{tag}: " + " ".join(f"w{i}" for i in range(30))  # ~62 tokens with the word pieces


def wait_for(server: Server, pending: int, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while server.health()["pool"]["pending"] != pending:
        assert time.monotonic() < deadline, f"pool never reached {pending} pending: {server.health()['pool']}"
        time.sleep(0.02)


def post_in_thread(server: Server, body: dict[str, Any], out: dict[str, httpx.Response]) -> threading.Thread:
    def run() -> None:
        with server.client() as c:
            out["response"] = c.post("/api/trace", json=body)

    t = threading.Thread(target=run)
    t.start()
    return t


def test_full_queue_is_503_and_past_deadline_is_504(tight: Server) -> None:
    first: dict[str, httpx.Response] = {}
    second: dict[str, httpx.Response] = {}
    a = post_in_thread(tight, {"text": slow_text("first"), **SLOW}, first)
    wait_for(tight, 1)
    b = post_in_thread(tight, {"text": slow_text("second"), **SLOW}, second)
    wait_for(tight, 2)
    with tight.client() as c:
        busy = c.post("/api/trace", json={"text": "one more"})
    assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
    assert "the server is busy" in busy.json()["error"]
    a.join()
    b.join()
    for r in (first["response"], second["response"]):
        assert r.status_code == 504, r.text
        assert f"longer than {TIMEOUT_S:g} s" in r.json()["error"]
    # the queued request was dropped; the running forward pass keeps its slot until it really ends
    assert tight.health()["pool"]["pending"] == 1
    wait_for(tight, 0)
    with tight.client() as c:
        assert c.post("/api/trace", json={"text": "one more"}).status_code == 200
