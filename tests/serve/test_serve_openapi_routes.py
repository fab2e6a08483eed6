"""The OpenAPI document is complete: every route the app serves is in it, and each route's accepted parameters
(body fields, query parameters) are the document's. What a route accepts is asked of the real server: an unknown
body field or query parameter is refused with a 422 that lists the ones it reads (serve.fields, serve.maps)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from starlette.routing import Route

from attnscope.serve.app import create_app
from attnscope.serve.settings import Settings
from tests.support.serve import MAX_TOKENS, Server

NOT_IN_THE_API = {("/", "GET"), ("/openapi.json", "GET")}  # the page and the document itself
PROBE = "zz_not_a_parameter"


@pytest.fixture(scope="module")
def routes() -> set[tuple[str, str]]:
    """Every (path, method) the app routes (threads=None: leave this process's torch threads alone)."""
    app = create_app(Settings(max_tokens=MAX_TOKENS, threads=None))
    out = {(r.path, m) for r in app.routes if isinstance(r, Route) for m in (r.methods or ()) if m != "HEAD"}
    return out - NOT_IN_THE_API


@pytest.fixture(scope="module")
def document(server: Server) -> dict[str, Any]:
    with server.client() as c:
        return dict(c.get("/openapi.json").json())


def test_every_route_is_in_the_document(routes: set[tuple[str, str]], document: dict[str, Any]) -> None:
    documented = {(path, method.upper()) for path, ops in document["paths"].items() for method in ops}
    assert documented == routes


def _listed(error: str, after: str) -> set[str]:
    """The names a refusal lists after `after`: "a, b and c" or "a, b, c"."""
    tail = error.split(after, 1)[1]
    return {n for n in re.split(r",\s*|\s+and\s+", tail.strip()) if n}


def test_every_body_field_is_documented(server: Server, routes: set[tuple[str, str]],
                                        document: dict[str, Any]) -> None:
    posts = sorted(path for path, method in routes if method == "POST")
    assert len(posts) == 11, posts
    for path in posts:
        with server.client() as c:
            r = c.post(path, json={PROBE: 1})
        assert r.status_code == 422, (path, r.text)
        accepted = _listed(r.json()["error"], "the fields are ")
        schema = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert set(schema["properties"]) == accepted, path
        assert schema["additionalProperties"] is False
        with server.client() as c:  # the first required field is the first one refused when missing
            missing = c.post(path, json={})
        assert missing.status_code == 422, (path, missing.text)
        assert f"field {schema['required'][0]!r} is required" in missing.json()["error"], path


def test_every_query_parameter_is_documented(server: Server, routes: set[tuple[str, str]],
                                            document: dict[str, Any]) -> None:
    with server.client() as c:
        traced = c.post("/api/trace", json={"text": "Query parameters, documented.", "stages": [], "payload": True,
                                            "maps": "lazy"})
        assert traced.status_code == 200, traced.text[:300]
        trace_id = traced.json()["payload"]["maps"]["trace"]
        r = c.get(f"/api/trace/{trace_id}/map", params={PROBE: "1"})
    assert r.status_code == 422, r.text
    accepted = _listed(r.json()["error"], ": use ")
    params = document["paths"]["/api/trace/{id}/map"]["get"]["parameters"]
    assert {p["name"] for p in params if p["in"] == "query"} == accepted
    assert [p["name"] for p in params if p["in"] == "path"] == ["id"]
    assert "level" in accepted  # the parameter the document once left out
    gets = sorted(path for path, method in routes if method == "GET" and "{" not in path)
    for path in gets:  # no other GET reads a parameter
        assert "parameters" not in document["paths"][path]["get"], path
