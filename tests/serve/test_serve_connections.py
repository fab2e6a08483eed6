"""Connections at the edges (issue 29), on real `attnscope serve` processes on loopback: a generate stream that
could pass --max-response is refused up front (422, naming how many new tokens fit; the cut at the limit is
tests/serve/test_serve_generate_size.py's), a client that hangs up mid-body or mid-stream is no internal
error, the connection cap answers JSON 503 with Retry-After and a request id, and silent sockets expire."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
import transformers as T

import attnscope
from tests.serve.test_serve_limits import wait_for
from tests.support.serve import Server, start_server

CAP = 12  # connections
HEADER_S = 1.0


@pytest.fixture(scope="module")
def decoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight GPT-2 with enough layers and heads that 64 tokens' attention rows pass 1 MiB of JSON."""
    torch.manual_seed(0)
    model = T.GPT2LMHeadModel(T.GPT2Config(n_embd=64, n_layer=16, n_head=16, vocab_size=30522, bos_token_id=101,
                                           eos_token_id=None))
    path = tmp_path_factory.mktemp("gpt2-wide")
    model.save_pretrained(path)
    attnscope.load_model().tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gen_server(decoder_dir: Path) -> Iterator[Server]:
    s = start_server("--model", str(decoder_dir), "--max-tokens", "32", "--max-response", "1")
    yield s
    assert s.stop() == 0, "".join(s.stderr)[-2000:]
    log = "".join(s.stderr)
    assert "Traceback" not in log and "internal error" not in log, log[-4000:]


@pytest.fixture(scope="module")
def tight() -> Iterator[Server]:
    s = start_server("--max-connections", str(CAP), "--header-timeout", str(HEADER_S), "--body-timeout", "5",
                     "--max-tokens", "32")
    yield s
    assert s.stop() == 0, "".join(s.stderr)[-2000:]
    log = "".join(s.stderr)
    assert "Traceback" not in log and "internal error" not in log, log[-4000:]


def test_a_stream_that_could_pass_the_response_limit_is_refused_up_front(gen_server: Server) -> None:
    with gen_server.client() as c:
        r = c.post("/api/generate", json={"prompt": "time flies like an arrow", "max_new_tokens": 64})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert "--max-response of 1 MiB" in error and "max_new_tokens" in error
    fits = int(re.search(r"at most (\d+) new tokens", error).group(1))  # type: ignore[union-attr]
    assert 1 <= fits < 64
    with gen_server.client() as c, c.stream("POST", "/api/generate",
                                            json={"prompt": "time flies like an arrow", "max_new_tokens": fits}) as r:
        assert r.status_code == 200
        raw = b"".join(r.iter_bytes())
    assert len(raw) <= 2**20 and raw.endswith(b"\n")  # as many as fit are served whole, within the budget
    events = [json.loads(line) for line in raw.splitlines()]
    assert [e["event"] for e in events] == ["start", *["token"] * fits, "done"]
    assert len(events[-1]["steps"]) == fits
    assert len(raw) > 2**19  # the estimate is not far above what is sent: half the budget at least


def test_a_client_leaving_mid_stream_is_no_error(gen_server: Server) -> None:
    with gen_server.client() as c, c.stream("POST", "/api/generate",  # 40: within --max-response, sized up front
                                            json={"prompt": "time flies", "max_new_tokens": 40}) as r:
        first = next(r.iter_lines())
        assert json.loads(first)["event"] == "start"
    wait_for(gen_server, 0, limit_s=30)  # the job stopped at its next token
    assert gen_server.health()["status"] == "ok"


def _raw(server: Server, data: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    if data:
        sock.sendall(data)
    return sock


def test_a_client_leaving_mid_body_is_no_error(tight: Server) -> None:
    head = (f"POST /api/trace HTTP/1.1\r\nHost: 127.0.0.1:{tight.port}\r\nContent-Type: application/json\r\n"
            "Content-Length: 500\r\n\r\n").encode()
    for _ in range(3):
        sock = _raw(tight, head + b'{"text": "hel')
        time.sleep(0.2)
        sock.close()
    time.sleep(0.5)
    assert tight.health()["status"] == "ok"
    assert "ClientDisconnect" not in "".join(tight.stderr)  # the fixture checks for tracebacks at the end


def test_the_connection_cap_is_a_json_503_and_silent_sockets_expire(tight: Server) -> None:
    silent = [_raw(tight) for _ in range(CAP + 2)]  # opened, nothing sent
    try:
        time.sleep(0.2)
        r = httpx.get(tight.url + "healthz", timeout=10)
        assert r.status_code == 503 and r.headers["content-type"] == "application/json"
        assert r.headers["retry-after"] == "1"
        rid = r.headers["x-request-id"]
        error = r.json()["error"]
        assert f"{CAP} connections open" in error and "--max-connections" in error and rid in error
        started = time.monotonic()
        while (ok := httpx.get(tight.url + "healthz", timeout=10)).status_code != 200:
            assert time.monotonic() - started < HEADER_S * 4, ok.text
            time.sleep(0.1)
        assert ok.json()["status"] == "ok"  # the header deadline closed the silent sockets
    finally:
        for s in silent:
            s.close()
