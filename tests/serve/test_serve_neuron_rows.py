"""POST /api/neuron with a query (issue 29, the long-context Neuron tab): the neuron view shows one query at a time,
so the page asks for that query's row of q, context, scores and weights (and every key's k and v) instead of the
whole [query, key] block (1.1 MB instead of 36 MB at 2,048 SmolLM2 tokens). The row is the whole block's row bit
for bit, in the binary and the JSON form, from the cached trace and from a long trace's kept x (serve.rows); a query
past the text is refused with 422 in one line. MiniLM, service level and over HTTP."""

from __future__ import annotations

import base64
import gc
import json
import threading
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from attnscope.errors import AttnscopeError
from attnscope.serve import binary
from attnscope.serve.api import NeuronRequest, TraceRequest
from attnscope.serve.service import Service
from attnscope.serve.settings import Settings
from tests.support.serve import Server

TEXT = " ".join(["The keeper counted the waves that broke over the harbour wall before dawn."] * 6)
N = 86  # MiniLM tokens of TEXT, [CLS] and [SEP] included
STOP = threading.Event()
KEY_SIDE = ("k", "v")


@pytest.fixture(scope="module")
def service() -> Service:
    return Service(Settings(max_tokens=128))


def binary_block(service: Service, layer: int, head: int, query: int | None) -> tuple[dict, dict[str, np.ndarray]]:
    req = NeuronRequest(TEXT, None, None, None, True, layer, head, query, binary=True)
    return binary.decode(service.neuron_body(req, STOP))


def json_block(service: Service, layer: int, head: int, query: int | None) -> tuple[dict, dict[str, np.ndarray]]:
    """A JSON block's fields and its stages as float32 arrays: a row block's query-side stages have one row."""
    block = json.loads(service.neuron_body(NeuronRequest(TEXT, None, None, None, True, layer, head, query), STOP))
    raw = base64.b64decode(block["data"])
    flat = np.frombuffer(zlib.decompress(raw) if block["encoding"].endswith("+zlib") else raw, "<f4")
    rows, d, at, out = (N if query is None else 1), block["d_head"], 0, {}
    for s in block["stages"]:
        shape = (N, d) if s in KEY_SIDE else (rows, d) if s in ("q", "context") else (rows, N)
        out[s] = flat[at:at + shape[0] * shape[1]].reshape(shape)
        at += shape[0] * shape[1]
    assert at == flat.size
    return block, out


def assert_rows_of(whole: dict[str, np.ndarray], row: dict[str, np.ndarray], query: int) -> None:
    """Every query-side stage of `row` is `whole`'s row `query` ([1, ...]), k and v are whole's, bit for bit."""
    assert list(row) == list(whole)
    for s, a in whole.items():
        want = a if s in KEY_SIDE else a[query:query + 1]
        assert row[s].dtype == np.float32 and row[s].shape == want.shape, (s, row[s].shape, want.shape)
        assert row[s].tobytes() == np.ascontiguousarray(want).tobytes(), s


@pytest.mark.parametrize(("layer", "head", "query"), [(0, 0, 0), (3, 7, 41), (5, 11, N - 1)])
def test_a_row_block_is_the_whole_blocks_row(service: Service, layer: int, head: int, query: int) -> None:
    header, whole = binary_block(service, layer, head, None)
    row_header, row = binary_block(service, layer, head, query)
    assert "query" not in header and row_header["query"] == query
    assert {k: v for k, v in row_header.items() if k not in ("query", "arrays")} == \
        {k: v for k, v in header.items() if k != "arrays"}
    assert_rows_of(whole, row, query)
    fields, from_json = json_block(service, layer, head, query)
    assert fields["query"] == query and fields["stages"] == row_header["stages"]
    assert_rows_of(whole, from_json, query)  # the JSON form carries the same row


def test_a_row_block_from_the_kept_x_is_the_cached_traces_row() -> None:
    service = Service(Settings(max_tokens=128))
    req = TraceRequest(TEXT, None, None, None, True, (), "base64", True, (), maps="lazy")
    service.trace_body(req, STOP)  # streamed (attnscope.tracing.streamed): its maps and x are kept, not the trace
    service.entry(req, STOP)  # the exact trace, cached
    whole = binary_block(service, 2, 5, None)[1]
    service.cache.clear()  # as a long trace: only the maps and the kept x stay
    misses = service.cache.misses
    header, row = binary_block(service, 2, 5, 60)
    assert service.cache.misses == misses  # no forward pass: the head recomputed from x (serve.rows)
    assert header["query"] == 60
    assert_rows_of(whole, row, 60)


def test_a_query_past_the_text_is_refused(service: Service) -> None:
    with pytest.raises(AttnscopeError, match="token"):
        binary_block(service, 0, 0, N)


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def test_the_route_takes_a_query_and_refuses_a_bad_one_in_json(http: httpx.Client) -> None:
    body = {"text": "The cat sat on the mat.", "layer": 1, "head": 2}
    whole = binary.decode(http.post("/api/neuron", json=body, headers={"accept": binary.MEDIA_TYPE}).content)
    r = http.post("/api/neuron", json=body | {"query": 3}, headers={"accept": binary.MEDIA_TYPE})
    assert r.status_code == 200 and r.headers["content-type"].startswith(binary.MEDIA_TYPE)
    header, row = binary.decode(r.content)
    assert header["query"] == 3
    assert_rows_of(whole[1], row, 3)
    for bad in (9, -1, "3", 1.5):  # 9 tokens: 9 is past the text; the rest are not token indices
        r = http.post("/api/neuron", json=body | {"query": bad}, headers={"accept": binary.MEDIA_TYPE})
        assert r.status_code == 422 and r.headers["content-type"].startswith("application/json"), (bad, r.text)
        assert "query" in r.json()["error"], r.json()


def test_a_recomputed_head_is_reused_and_lets_its_trace_go(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Neuron tab's head, then another query of it (or a cell's explanation): one recompute (serve.rows'
    RecentHeads); once the map store lets the trace go, the reused arrays do not keep its kept x alive."""
    from attnscope.serve import rows

    service = Service(Settings(max_tokens=128))
    req = TraceRequest(TEXT, None, None, None, True, (), "base64", True, (), maps="lazy")
    service.trace_body(req, STOP)  # streamed: its maps and x are kept
    service.entry(req, STOP)
    whole = binary_block(service, 1, 2, None)[1]  # from the cached exact trace
    service.cache.clear()
    made: list[tuple[int, int]] = []
    real = rows.one_head

    def counted(r: rows.Rows, m: Any, layer: int, head: int) -> Any:  # the real recompute, counted
        made.append((layer, head))
        return real(r, m, layer, head)

    monkeypatch.setattr(rows, "one_head", counted)
    for query in (10, 40, 10):
        assert_rows_of(whole, binary_block(service, 1, 2, query)[1], query)
    assert made == [(1, 2)]  # recomputed once, then reused
    binary_block(service, 3, 0, 5)
    assert made == [(1, 2), (3, 0)]
    refs = [ref for ref, _ in service.heads._kept.values()]
    assert refs and all(ref() is not None for ref in refs)
    service.maps.clear()  # evicted: nothing else holds its kept x
    gc.collect()
    assert all(ref() is None for ref in refs)
