"""Every input gets an answer (issue 29): an explanation sized before it is built, odd digits in a header."""

from __future__ import annotations

import socket

from tests.support.serve import Server


def test_an_explanation_over_the_response_limit_is_a_422(long_server: Server) -> None:
    """400 tokens explained whole hold ~1.5M numbers, over --max-response 4 MiB: refused up front, not a 500."""
    text = " ".join(["word"] * 400)
    with long_server.client() as c:
        r = c.post("/api/explain", json={"text": text, "layer": 0, "head": 0, "max_length": 512})
        assert r.status_code == 422, r.text
        assert "give a token to follow one query row" in r.json()["error"]
        one_row = c.post("/api/explain", json={"text": text, "layer": 0, "head": 0, "token": 5, "max_length": 512})
        assert one_row.status_code == 200, one_row.text


def test_a_host_port_in_other_digits_is_refused_not_a_500(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:²\r\nConnection: close\r\n\r\n".encode())
        status = s.recv(200).split(b"\r\n")[0]
    assert status.startswith(b"HTTP/1.1 4"), status
