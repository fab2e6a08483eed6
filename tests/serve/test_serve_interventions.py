"""POST /api/ablate and /api/patch on a real `attnscope serve` (the bundled MiniLM): the numbers equal the
library's, the grid comes with its heatmap payload, and bad input is a one-line 422."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import attnscope
from attnscope.interventions import ablate
from tests.support.serve import Server, start_server

TEXT = "The cat sat on the mat."


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = start_server("--max-tokens", "32")
    yield s
    assert s.stop() == 0 and "Traceback" not in "".join(s.stderr), "".join(s.stderr)[-2000:]


def test_ablate_endpoint_equals_the_library(server: Server, minilm: attnscope.Model) -> None:
    with server.client() as http:
        r = http.post("/api/ablate", json={"text": TEXT, "heads": "5.11", "each": True})
    assert r.status_code == 200, r.text
    body = r.json()
    direct = ablate(TEXT, [(5, 11)], model=minilm, each=True)
    assert direct.ablated is not None and direct.grid is not None
    assert abs(body["ablated"]["embedding_distance"] - direct.ablated["embedding_distance"]) <= 1e-6
    assert body["effects"]["grids"][0]["name"] == "embedding_distance"
    assert len(body["effects"]["grids"][0]["values"]) == 6


@pytest.mark.parametrize(("path", "body", "message"), [
    ("/api/ablate", {"text": TEXT, "heads": "9.0"}, "layer 9 is out of range"),
    ("/api/ablate", {"text": TEXT, "heads": "x"}, "not layer.head"),
    ("/api/ablate", {"text": TEXT, "heads": " "}, 'is empty: name heads as layer.head, such as "3.1,0.7"'),
    ("/api/patch", {"clean": "the cat", "corrupt": "the big dog barks"}, "tokens and the corrupt text"),
    ("/api/ablate", {"text": TEXT, "unknown": 1}, "unknown"),
])
def test_refusals_are_one_line(server: Server, path: str, body: dict[str, object], message: str) -> None:
    with server.client() as http:
        r = http.post(path, json=body)
    assert r.status_code == 422 and message in r.json()["error"] and "\n" not in r.json()["error"]


def test_patch_endpoint(server: Server) -> None:
    with server.client() as http:
        r = http.post("/api/patch", json={"clean": "The cat sat on the mat.", "corrupt": "The dog sat on the mat."})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["clean"] == pytest.approx(1.0, abs=1e-6) and body["corrupt"] < 1.0
    assert [g["name"] for g in body["effects"]["grids"]] == ["denoised", "noised"]
