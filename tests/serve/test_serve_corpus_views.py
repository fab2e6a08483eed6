"""POST /api/qkmap and GET/POST /api/heads (serve/corpus_views.py) on a real `attnscope serve --index INDEX --heads
DIR` (a tiny MiniLM index and heads pass of UD sentences and one hostile sentence, built here): each answer is the
library's payload for the same arguments (views.qkmap.qkmap_payload, views.heads.heads_payload); what the index or
the heads cannot answer is a one-line 4xx; and `serve --heads` refuses a directory it cannot use in one line, exit 2."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import attnscope
from attnscope.corpus.head_groups import read_groups
from attnscope.corpus.maps import available
from attnscope.corpus.store import CorpusIndex
from attnscope.serve.corpus_views import POINT_SECONDS, START_SECONDS
from attnscope.views.heads import heads_payload
from attnscope.views.qkmap import qkmap_payload
from tests.support.pages import spills
from tests.support.random_models import save_random_bert
from tests.support.serve import ARTIFACTS, Server, serve_command, served
from tests.support.serve_explore import HEADS, HOSTILE, LAYERS, corpus, explore_heads, explore_index

# Points are rounded to 5 decimals in both payloads (views.qkmap.DIGITS): the same float64 PCA in two processes may
# land either side of a rounding boundary, one unit of the last decimal apart.
POINTS = 1.1e-5


@pytest.fixture(scope="module")
def explored_data(minilm: attnscope.Model, ud_dev: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("serve-explore")
    conllu = corpus(ud_dev, root / "corpus.conllu")
    return explore_index(minilm, conllu, root / "index"), explore_heads(minilm, conllu, root / "heads")


@pytest.fixture(scope="module")
def explored(explored_data: tuple[Path, Path]) -> Iterator[Server]:
    """`attnscope serve --index INDEX --heads DIR`, the model from them (no --model), a 20 s deadline."""
    index_dir, heads_dir = explored_data
    yield from served("--index", str(index_dir), "--heads", str(heads_dir), "--max-tokens", "32", "--timeout", "20")


@pytest.fixture(scope="module")
def other_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight BERT with MiniLM's tokenizer: a model the heads were not computed with."""
    return save_random_bert(tmp_path_factory.mktemp("random-bert"))


def post(server: Server, path: str, body: dict[str, Any]) -> Any:
    with server.client(timeout=120) as http:
        return http.post(path, json=body)


def same_map(got: dict[str, Any], want: dict[str, Any]) -> None:
    """The served payload is the library's: every field equal, the points within POINTS."""
    got_maps, want_maps = got.pop("maps"), want.pop("maps")
    assert got == want
    assert [m["head"] for m in got_maps] == [m["head"] for m in want_maps]
    for g, w in zip(got_maps, want_maps, strict=True):
        for kind in ("queries", "keys"):
            a, b = np.array(g.pop(kind)), np.array(w.pop(kind))
            assert a.shape == b.shape and np.abs(a - b).max() <= POINTS, (g["head"], kind)
        assert g.pop("scale") == pytest.approx(w.pop("scale"), rel=1e-12)
        assert g == w  # layer, head, explained shares (None for t-SNE)


MAPS = [({"layer": 0, "head": 1, "limit": 120}, None), ({"layer": 5, "head": None, "colour": "upos"}, None),
        ({"layer": 5, "head": 4, "projection": "tsne", "limit": 30, "seed": 3}, "tsne")]


@pytest.mark.parametrize(("body", "needs"), MAPS)
def test_the_map_is_the_librarys(explored: Server, explored_data: tuple[Path, Path], body: dict[str, Any],
                                 needs: str | None) -> None:
    if needs is not None and needs not in available():
        pytest.skip(f"{needs} is not installed here (the 422 test covers that case)")
    r = post(explored, "/api/qkmap", body)
    assert r.status_code == 200, r.text
    got = r.json()
    index = CorpusIndex(explored_data[0])
    assert got.pop("index") == {"model": "all-MiniLM-L6-v2", "layers": list(LAYERS), "heads": list(HEADS),
                                "documents": index.n_documents, "tokens": index.n_tokens,
                                "by": ["embedding", "context", "query", "key"], "approximate": "faiss", "max_k": 200}
    head = body.get("head")
    want = qkmap_payload(index, body["layer"], None if head is None else [head], limit=body.get("limit", 500),
                         seed=body.get("seed", 0), method=body.get("projection", "pca"),
                         colour=body.get("colour", "kind"))
    assert got.pop("corpus") == "corpus.conllu" == Path(want.pop("corpus")).name  # not the server's directories
    same_map(got, json.loads(json.dumps(want)))
    assert len(got["tokens"]) == min(body.get("limit", 500), index.n_tokens)
    if len(got["tokens"]) == index.n_tokens:
        assert {t["text"] for t in got["tokens"]} >= {"<", "script"}  # the hostile sentence, as text


def _umap_missing() -> list[Any]:
    return [] if "umap" in available() else [({"projection": "umap"}, "pip install umap-learn, or use projection pca")]


@pytest.mark.parametrize(("body", "message"), [
    ({"layer": 3}, "holds layers 0, 5 (0-indexed), not layer=3"),
    ({"head": 2}, "holds the q and k of heads 1, 4 (0-indexed), not head=2"),
    ({"projection": "mds"}, "field 'projection' must be one of 'pca', 'tsne', 'umap'"),
    ({"colour": "lemma"}, "field 'colour' must be one of 'kind', 'position', 'upos', 'deprel'"),
    ({"limit": 0}, "field 'limit' must be from 1 to 20000"),
    ({"layer": -1}, "field 'layer' must be from 0"),
    ({"head": "1"}, "field 'head' must be an integer"),
    *_umap_missing(),
])
def test_what_the_index_cannot_map_is_a_one_line_422(explored: Server, explored_data: tuple[Path, Path],
                                                     body: dict[str, Any], message: str) -> None:
    r = post(explored, "/api/qkmap", {"layer": 5, "head": 1, **body})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert message in error and "\n" not in error, error
    assert str(explored_data[0]) not in error  # the server's paths are not the client's business


def test_a_projection_over_the_deadline_is_refused_at_once_saying_what_fits(explored: Server,
                                                                           explored_data: tuple[Path, Path]) -> None:
    if "tsne" not in available():
        pytest.skip("scikit-learn is not installed here")
    tokens = CorpusIndex(explored_data[0]).n_tokens  # every token of 2 heads: over the 20 s
    assert 2 * (START_SECONDS + 2 * tokens * POINT_SECONDS["tsne"]) > 20
    started = time.monotonic()
    r = post(explored, "/api/qkmap", {"layer": 5, "head": None, "projection": "tsne", "limit": 20000})
    assert r.status_code == 422, r.text
    assert time.monotonic() - started < 2  # refused before it runs
    error = r.json()["error"]
    fits = int((20 / 2 - START_SECONDS) / (2 * POINT_SECONDS["tsne"]))  # with all of the 20 s left
    assert f"a tsne map of 2 heads x {tokens} tokens ({2 * tokens} points each) takes about" in error
    said = re.search(r"over the 20 s left before this request's deadline: ask for limit at most (\d+), one head or "
                     r"projection pca, or start the server with a longer --timeout", error)
    assert said and fits - 2 <= int(said.group(1)) <= fits, error  # the time spent reading the request


def test_the_heads_are_the_librarys(explored: Server, explored_data: tuple[Path, Path]) -> None:
    heads_dir = explored_data[1]
    with explored.client() as http:
        got = http.get("/api/heads").json()
    g = read_groups(heads_dir)
    source = {"model": g.model, "layers": 6, "heads": 12, "documents": g.documents, "tokens": g.tokens}
    assert got.pop("source") == source
    assert got == json.loads(json.dumps(heads_payload(g)).replace("NaN", "null"))
    assert len(got["names"]) == 72 and max(got["clusters"]) == round(72**0.5)
    r = post(explored, "/api/heads", {"clusters": 3})
    assert r.status_code == 200, r.text
    cut = r.json()
    cut.pop("source")
    assert cut == json.loads(json.dumps(heads_payload(read_groups(heads_dir, 3))).replace("NaN", "null"))
    assert max(cut["clusters"]) == 3


@pytest.mark.parametrize(("body", "message"), [
    ({"clusters": 0}, "field 'clusters' must be from 1 to 72"),
    ({"clusters": 73}, "field 'clusters' must be from 1 to 72"),
    ({}, "field 'clusters' is required"),
    ({"clusters": 3, "k": 1}, "unknown field 'k': the fields are clusters"),
])
def test_what_the_heads_cannot_answer_is_a_one_line_422(explored: Server, body: dict[str, Any], message: str) -> None:
    r = post(explored, "/api/heads", body)
    assert r.status_code == 422, r.text
    assert message in r.json()["error"] and "\n" not in r.json()["error"]


def test_without_an_index_or_heads_they_are_404s_saying_how_to_load_them(server: Server) -> None:
    r = post(server, "/api/qkmap", {"layer": 0})
    assert r.status_code == 404, r.text
    assert "attnscope serve --index INDEX" in r.json()["error"]
    with server.client() as http:
        got = http.get("/api/heads")
    assert got.status_code == 404 and "attnscope serve --heads DIR" in got.json()["error"]
    assert post(server, "/api/heads", {"clusters": 2}).status_code == 404
    assert post(server, "/api/qkmap", {}).status_code == 422  # the body is checked first


@pytest.mark.parametrize(("args", "message"), [
    (["--heads", "/nonexistent/heads"], "--heads: /nonexistent/heads does not exist: run attnscope heads SOURCE"),
    (["--heads", "INDEX"], "does not exist: run attnscope heads SOURCE -o DIR first"),
    (["--heads", "HEADS", "--model", "OTHER"], "was written by a pass of all-MiniLM-L6-v2, which this server does not "
                                               "serve"),
])
def test_serve_refuses_heads_it_cannot_use(explored_data: tuple[Path, Path], other_model: Path, args: list[str],
                                           message: str) -> None:
    names = {"INDEX": str(explored_data[0]), "HEADS": str(explored_data[1]), "OTHER": str(other_model)}
    done = subprocess.run(serve_command("--port", "0", *[names.get(a, a) for a in args]), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_page_draws_both_panels_escapes_hover_text_and_a_head_click_opens_it(
        explored: Server, explored_data: tuple[Path, Path]) -> None:
    """In Chromium: the heads panel draws every head (dendrogram leaves and map points) at once; the query/key map of
    layer 5's two kept heads draws a query and a key point per token of the index; hovering the hostile sentence's
    "script" shows it in its sentence as text (no element made of it); a click on head 3.5's leaf sets the views'
    layer and head."""
    from attnscope.views.browser import chromium

    index = CorpusIndex(explored_data[0])
    with chromium() as b:
        page = b.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.on("dialog", lambda d: (errors.append(d.message), d.dismiss()))
        page.goto(explored.url)
        page.wait_for_selector("#sv-status[data-kind=ok]", timeout=60_000)
        page.wait_for_selector("#sv-heads-status[data-kind=ok]", timeout=60_000)
        assert page.locator("#sv-heads-out circle[data-unit]").count() == 72
        assert page.locator("#sv-heads-out text.as-hd-leaf").count() == 72
        assert page.get_attribute("#sv-heads-out", "data-heads") == "72"

        page.select_option("#sv-qkmap-layer", "5")
        page.select_option("#sv-qkmap-head", "")
        page.fill("#sv-qkmap-limit", "300")
        page.click("#sv-qkmap-go")
        page.wait_for_function("() => ['ok', 'error'].includes(document.getElementById('sv-qkmap-status')"
                               ".dataset.kind)", timeout=60_000)
        assert page.get_attribute("#sv-qkmap-status", "data-kind") == "ok", page.text_content("#sv-qkmap-status")
        assert page.locator("#sv-qkmap-out figure.as-qk-panel").count() == 2
        assert page.locator("#sv-qkmap-out circle.as-qk-point").count() == 2 * 2 * index.n_tokens
        data = qkmap_payload(index, 5, limit=300)
        hostile = [i for i, t in enumerate(data["tokens"]) if "<script>" in data["documents"][str(t["doc"])]]
        # a real hover: the first of the hostile sentence's points that no other point covers at its centre
        page.locator("#sv-qkmap-out .as-qk-grid").scroll_into_view_if_needed()
        found = page.evaluate("""(rows) => {
          for (const c of document.querySelectorAll('#sv-qkmap-out circle.as-qk-point')) {
            if (!rows.includes(Number(c.dataset.row))) continue;
            const r = c.getBoundingClientRect();
            const [x, y] = [r.left + r.width / 2, r.top + r.height / 2];
            if (document.elementFromPoint(x, y) === c) return [x, y, c.dataset.kind, c.dataset.head, c.dataset.row];
          }
          return null; }""", hostile)
        assert found is not None
        x, y, kind, head, row = found
        page.mouse.move(x, y)
        tip = page.locator("#sv-qkmap-out .as-qk-tip")
        tip.wait_for(state="visible")
        token = data["tokens"][int(row)]
        text = str(tip.text_content())
        assert f"{kind} · head {head} · token {json.dumps(token['text'])} at position {token['position']}" in text
        assert HOSTILE in text
        assert tip.locator("mark").text_content() == token["text"]
        assert tip.locator("script, img").count() == 0 and page.locator("img").count() == 0
        page.mouse.move(5, 5)
        tip.wait_for(state="hidden")
        page.locator("#sv-qkmap").screenshot(path=str(ARTIFACTS / "qkmap-panel.png"))

        page.locator("#sv-heads-out text.as-hd-leaf[data-unit='41']").click()  # unit 41: layer 3, head 5
        page.wait_for_function("() => document.getElementById('sv-heads-status').dataset.kind === 'ok' && "
                               "document.getElementById('sv-views').dataset.headsPicked === '3.5'", timeout=30_000)
        assert page.text_content("#sv-heads-status") == "layer 3, head 5 opened in the views"
        state = page.evaluate("() => { const s = document.getElementById('sv-views').attnscopeShown.state(); "
                              "return [s.layer, s.head, s.heads]; }")
        assert state == [3, 5, [5]]
        page.locator("#sv-heads").screenshot(path=str(ARTIFACTS / "heads-panel.png"))
    assert errors == []
    assert all(u.startswith(explored.url) or u.startswith("data:") for u in requests), requests


@pytest.mark.parametrize("width", [1280, 1920])
def test_the_heads_and_map_panels_fit_the_page(explored: Server, width: int) -> None:
    """At 1280 and 1920 px, with the heads drawn and a query/key map of two heads open: nothing in either panel runs
    past its right edge (but inside a scroll box of its own), the page does not scroll sideways, and the heads'
    picture (dendrogram and map) needs no sideways scroll of its own either."""
    from attnscope.views.browser import chromium

    with chromium() as b:
        page = b.new_page(viewport={"width": width, "height": 1000})
        page.goto(explored.url)
        page.wait_for_selector("#sv-heads-status[data-kind=ok]", timeout=60_000)
        page.select_option("#sv-qkmap-layer", "5")
        page.select_option("#sv-qkmap-head", "")
        page.fill("#sv-qkmap-limit", "300")
        page.click("#sv-qkmap-go")
        page.wait_for_selector("#sv-qkmap-status[data-kind=ok]", timeout=60_000)
        for panel in ("sv-heads", "sv-qkmap"):
            found = spills(page, panel)
            assert found == {"spills": [], "sideways": 0, "page": 0}, (width, panel, found)
        # the heads' picture needs no sideways scroll of its own: the map goes below the dendrogram where both do not
        # fit side by side (1280), beside it where they do (1920)
        box = page.evaluate("""() => { const f = document.querySelector('#sv-heads-out .as-hd-figure');
          const d = f.querySelector('.as-hd-dendrogram').getBoundingClientRect();
          const m = f.querySelector('.as-hd-map').getBoundingClientRect();
          return [f.scrollWidth - f.clientWidth, m.top >= d.bottom - 1]; }""")
        assert box == [0, width < 1500], (width, box)
        page.screenshot(path=str(ARTIFACTS / f"corpus-panels-{width}.png"), full_page=True)
