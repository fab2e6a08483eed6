"""POST /api/search (serve/search.py) on a real `attnscope serve --index INDEX` (a tiny MiniLM index of UD
sentences built here): the answer is attnscope.corpus.query.search's for the same query, by every kind of vector,
exact and approximate; what the index cannot answer is a one-line 422 (404 on a server without an index); and
`serve --index` refuses an index it cannot use in one line, exit 2."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import attnscope
from attnscope.corpus.query import search
from attnscope.corpus.store import CorpusIndex
from tests.support.pages import click_matrix_cell, open_app, trace_in_app
from tests.support.random_models import save_random_bert
from tests.support.serve import ARTIFACTS, Server, serve_command, served
from tests.support.serve_index import HEADS, LAYERS, SENTENCES, tiny_index

TEXT = "The president nominated a judge to the court."
TOLERANCE = 1e-5  # distances: the query token's float32 vector from two processes, each on one torch thread


@pytest.fixture(scope="module")
def index_dir(minilm: attnscope.Model, ud_dev: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_index(minilm, ud_dev, tmp_path_factory.mktemp("serve-index") / "index")


@pytest.fixture(scope="module")
def other_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight BERT with MiniLM's tokenizer: a model the index was not built with."""
    return save_random_bert(tmp_path_factory.mktemp("random-bert"))


@pytest.fixture(scope="module")
def indexed(index_dir: Path, other_model: Path) -> Iterator[Server]:
    """`attnscope serve --index` serving the index's model and one more."""
    yield from served("--index", str(index_dir), "--model", "all-MiniLM-L6-v2", str(other_model), "--max-tokens", "32")


def post(server: Server, body: dict[str, Any]) -> Any:
    with server.client(timeout=60) as http:
        return http.post("/api/search", json=body)


QUERIES = [("embedding", 5, None, False), ("embedding", 0, None, True), ("context", 5, None, True),
           ("context", 0, None, False), ("query", 5, 1, True), ("key", 0, 1, True)]


@pytest.mark.parametrize(("by", "layer", "head", "exact"), QUERIES)
def test_the_answer_is_the_librarys(indexed: Server, index_dir: Path, minilm: attnscope.Model,
                                    one_torch_thread: None, by: str, layer: int, head: int | None,
                                    exact: bool) -> None:
    r = post(indexed, {"text": TEXT, "token": 2, "layer": layer, "by": by, "head": head, "k": 15, "exact": exact})
    assert r.status_code == 200, r.text
    body = r.json()
    want = search(CorpusIndex(index_dir), TEXT, token=2, layer=layer, by=by, head=head, k=15, model=minilm,
                  exact=exact).to_dict()
    got_matches, want_matches = body.pop("matches"), want.pop("matches")
    assert body.pop("index")["layers"] == list(LAYERS)
    assert body == want  # the query, how it was searched and the summary of the matches
    assert [m["row"] for m in got_matches] == [m["row"] for m in want_matches]
    for g, w in zip(got_matches, want_matches, strict=True):
        assert abs(g.pop("distance") - w.pop("distance")) <= TOLERANCE
        assert g == w  # sentence, offsets, token, position, UD labels
    assert body["method"] == ("exact" if exact or by in ("query", "key") else "approximate (faiss)")


def test_the_answer_says_what_the_index_holds(indexed: Server) -> None:
    body = post(indexed, {"text": TEXT, "token": 2, "layer": 5, "k": 3}).json()
    assert body["index"] == {"model": "all-MiniLM-L6-v2", "layers": list(LAYERS), "heads": list(HEADS),
                             "documents": SENTENCES, "tokens": body["index"]["tokens"],
                             "by": ["embedding", "context", "query", "key"], "approximate": "faiss", "max_k": 200}
    assert len(body["matches"]) == 3 and body["token_text"] == "president"
    match = body["matches"][0]
    assert match["text"][match["start"]:match["end"]] == match["token"]


@pytest.mark.parametrize(("body", "message"), [
    ({"layer": 3}, "holds layers 0, 5 (0-indexed), not layer=3"),
    ({"by": "query"}, "give head=H, one of 1 (0-indexed)"),
    ({"by": "key", "head": 0}, "holds the q and k of heads 1 (0-indexed), not head=0"),
    ({"by": "embedding", "head": 1}, "head=1 applies to by='query' and by='key'"),
    ({"token": 20}, "token 20 is out of range: the query text has 11 tokens"),
    ({"token": 32}, "field 'token' must be from 0 to 31"),
    ({"k": 0}, "field 'k' must be from 1 to 200"),
    ({"by": "attention"}, "field 'by' must be one of 'embedding', 'context', 'query', 'key'"),
    ({"text": "word " * 40}, "over this server's limit of 32"),
])
def test_what_the_index_cannot_answer_is_a_one_line_422(indexed: Server, index_dir: Path, body: dict[str, Any],
                                                        message: str) -> None:
    r = post(indexed, {"text": TEXT, "token": 2, "layer": 5, **body})
    assert r.status_code == 422, r.text
    assert message in r.json()["error"] and "\n" not in r.json()["error"]
    assert str(index_dir) not in r.json()["error"]  # the server's paths are not the client's business


def test_another_model_than_the_indexs_is_a_422_naming_both(indexed: Server, other_model: Path) -> None:
    r = post(indexed, {"text": TEXT, "token": 2, "layer": 0, "model": str(other_model)})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert "the index was built with all-MiniLM-L6-v2, not" in error and "model=all-MiniLM-L6-v2" in error


def test_without_an_index_search_is_a_404_saying_how_to_load_one(server: Server) -> None:
    r = post(server, {"text": TEXT, "token": 2, "layer": 0})
    assert r.status_code == 404, r.text
    assert "attnscope serve --index INDEX" in r.json()["error"]
    assert post(server, {"text": TEXT, "token": 2}).status_code == 422  # the body is checked first


@pytest.mark.parametrize(("args", "message"), [
    (["--index", "/nonexistent/index"], "--index: /nonexistent/index is not a corpus index"),
    (["--index", "INDEX", "--model", "OTHER"], "was built with all-MiniLM-L6-v2, which this server does not serve"),
])
def test_serve_refuses_an_index_it_cannot_use(index_dir: Path, other_model: Path, args: list[str],
                                              message: str) -> None:
    args = [str(index_dir) if a == "INDEX" else str(other_model) if a == "OTHER" else a for a in args]
    done = subprocess.run(serve_command("--port", "0", *args), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


HOSTILE = "The judge <img src=x onerror=alert(1)> nominated."


def test_a_click_on_a_token_finds_similar_tokens_in_the_corpus(indexed: Server, index_dir: Path,
                                                               minilm: attnscope.Model, one_torch_thread: None) -> None:
    """In Chromium: trace a (hostile) text, click a matrix cell at layer 5 (0-indexed), follow "find similar tokens
    in the corpus": the matches drawn are the library's for that token and layer, every text shown as text."""
    from attnscope.views.browser import chromium

    layer, query = 5, 2  # "judge"
    with chromium() as b:
        seen = open_app(b, indexed.url)
        page = seen.page
        assert page.locator("#sv-search").is_visible()
        trace_in_app(page, HOSTILE, "matrix")
        page.locator("#sv-views .as-panel select").first.select_option(str(layer))
        click_matrix_cell(page, query, 0)
        page.wait_for_selector("#sv-links:not([hidden]) #sv-link-search")
        assert f'token {query} "judge":' in str(page.text_content("#sv-links"))
        page.click("#sv-link-search")
        page.wait_for_function("() => ['ok', 'error'].includes(document.getElementById('sv-search-status')"
                               ".dataset.kind)", timeout=60_000)
        assert page.get_attribute("#sv-search-status", "data-kind") == "ok", page.text_content("#sv-search-status")
        drawn = page.eval_on_selector_all("#sv-search-out .sv-matches li", "ls => ls.map(l => "
                                          "[+l.dataset.distance, l.querySelector('mark').textContent])")
        line = str(page.text_content("#sv-search-out .sv-fx-line"))
        assert page.input_value("#sv-search-text") == HOSTILE and page.input_value("#sv-search-layer") == str(layer)
        page.locator("#sv-search").screenshot(path=str(ARTIFACTS / "search-panel.png"))
        assert page.locator("img").count() == 0 and seen.errors == [] and seen.dialogs == []
    want = search(CorpusIndex(index_dir), HOSTILE, token=query, layer=layer, k=20, model=minilm)
    assert [token for _, token in drawn] == [m.token or "(special token)" for m in want.matches]
    assert max(abs(d - m.distance) for (d, _), m in zip(drawn, want.matches, strict=True)) <= TOLERANCE
    assert line.startswith(f'"judge" (token {query} of the query) at layer {layer}, by embedding: 20 nearest')
