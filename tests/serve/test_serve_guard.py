"""Only the server's own pages and local clients: Host, Origin, Content-Type, preflight and the access token.

Every request goes to a real `attnscope serve` on 127.0.0.1; the headers are what a DNS-rebinding page,
a cross-site form or fetch, or a remote client without the token would send.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.support.serve import Server, start_server

EXPLAIN = json.dumps({"text": "The cat sat.", "layer": 3, "head": 7}).encode()
JSON_TYPE = {"Content-Type": "application/json"}


def post(server: Server, headers: dict[str, str], body: bytes = EXPLAIN, path: str = "/api/explain") -> httpx.Response:
    with server.client() as c:
        return c.post(path, content=body, headers={**JSON_TYPE, **headers})


@pytest.mark.parametrize("host", ["evil.example:{port}", "evil.example", "127.0.0.1:1", "localhost.evil.example:{port}",
                                  "127.0.0.1.nip.io:{port}"])
def test_a_foreign_host_is_403_without_any_weights(server: Server, host: str) -> None:
    r = post(server, {"Host": host.format(port=server.port)})
    assert r.status_code == 403, r.text[:200]
    assert "is not this server" in r.json()["error"] and "steps" not in r.text


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}", "LOCALHOST:{port}"])
def test_local_hosts_with_the_port_are_served(server: Server, host: str) -> None:
    name = host.format(port=server.port)
    r = post(server, {"Host": name, "Origin": f"http://{name}"})
    assert r.status_code == 200, r.text[:200]
    assert r.headers["x-request-id"]


@pytest.mark.parametrize("origin", ["https://evil.example", "null", "http://localhost:1", "http://127.0.0.1"])
def test_a_foreign_origin_is_403(server: Server, origin: str) -> None:
    r = post(server, {"Origin": origin})
    assert r.status_code == 403 and "are not allowed" in r.json()["error"]


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          "", "application/jsonp"])
def test_a_body_that_is_not_declared_json_is_415(server: Server, content_type: str) -> None:
    """A page sends text/plain or form bodies cross-site without a preflight: they never reach the model."""
    before = server.health()["cache"]["misses"]
    r = post(server, {"Content-Type": content_type, "Origin": server.url.rstrip("/")},
             body=json.dumps({"text": "a new text for 415", "layer": 0}).encode())
    assert r.status_code == 415 and "Content-Type: application/json" in r.json()["error"]
    assert server.health()["cache"]["misses"] == before  # nothing was traced


def test_json_with_a_charset_is_json(server: Server) -> None:
    assert post(server, {"Content-Type": "Application/JSON; charset=utf-8"}).status_code == 200


def test_the_preflight_is_refused(server: Server) -> None:
    with server.client() as c:
        r = c.options("/api/explain", headers={"Origin": "https://evil.example",
                                               "Access-Control-Request-Method": "POST",
                                               "Access-Control-Request-Headers": "content-type"})
    assert r.status_code == 403
    assert not [h for h in r.headers if h.lower().startswith("access-control-")]


@pytest.fixture(scope="module")
def locked() -> Iterator[Server]:
    """A server with an access token, as one bound beyond loopback has (given here, on loopback)."""
    s = start_server("--token", "a-long-secret-token", "--max-tokens", "16", "--cache", "2")
    yield s
    assert s.stop() == 0


def test_the_token_is_printed_and_required(locked: Server) -> None:
    assert locked.token == "a-long-secret-token"
    bare = httpx.post(locked.url + "api/explain", content=EXPLAIN, headers=JSON_TYPE, timeout=60)
    assert bare.status_code == 403 and "access token" in bare.json()["error"]
    wrong = httpx.post(locked.url + "api/explain", content=EXPLAIN, headers={**JSON_TYPE, "Authorization": "token x"},
                       timeout=60)
    assert wrong.status_code == 403
    assert httpx.get(locked.url, timeout=60).status_code == 403  # the page too


def test_the_token_url_sets_a_cookie_the_page_then_uses(locked: Server) -> None:
    with httpx.Client(base_url=locked.url, timeout=60) as c:  # no Authorization header: a browser
        page = c.get(f"/?token={locked.token}")
        assert page.status_code == 200 and "attnscope" in page.text
        cookie = page.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        assert c.post("/api/explain", content=EXPLAIN, headers=JSON_TYPE).status_code == 200  # by the cookie
    with httpx.Client(base_url=locked.url, timeout=60, headers=locked.auth) as c:  # a script: the header
        assert c.post("/api/explain", content=EXPLAIN, headers=JSON_TYPE).status_code == 200


def test_every_refusal_is_written_alike(server: Server) -> None:
    """The guard's refusals (403, 415, sent from the middleware) and the app's (422) are one JSON form: compact,
    UTF-8, with its length; a client can compare them byte for byte."""
    foreign = post(server, {"Origin": "https://evil.example"})
    not_json = post(server, {"Content-Type": "text/plain"})
    invalid = post(server, {}, body=b'{"text": "\xc3\xa9", "layer": -1}')
    for r, status in ((foreign, 403), (not_json, 415), (invalid, 422)):
        assert r.status_code == status, r.text[:200]
        assert r.content == json.dumps(r.json(), ensure_ascii=False, separators=(",", ":")).encode(), status
        assert r.headers["content-length"] == str(len(r.content)) and r.headers["content-type"] == "application/json"
