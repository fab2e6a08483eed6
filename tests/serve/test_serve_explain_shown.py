"""What the web app asks of a head (issue 29): /api/explain's "shown" arrays and /api/neuron's binary form carry the
numbers of the full answers exactly, and only what the page reads.

Service-level, on MiniLM: "shown" against "all" (attnscope explain's JSON) of the same walkthrough, cell by cell,
with the rows and columns the page's keep() shows (serve.js, written out again here); the binary neuron block
against the JSON one, stage by stage, from the cached trace and from a long trace's kept x (serve.rows)."""

from __future__ import annotations

import base64
import json
import threading
import zlib

import numpy as np
import pytest

from attnscope.serve import binary
from attnscope.serve.api import ExplainRequest, NeuronRequest, TraceRequest
from attnscope.serve.service import Service
from attnscope.serve.settings import Settings

TEXT = " ".join(["The keeper counted the waves that broke over the harbour wall before dawn."] * 6)
KEY_STAGES = ("scores", "scaled", "masked", "weights")
STOP = threading.Event()
N = 86  # MiniLM tokens of TEXT, [CLS] and [SEP] included


def keep(n: int, limit: int, must: int | None) -> list[int]:
    """serve.js keep() without its gap marker: the indices of an axis the page shows."""
    if n <= limit:
        return list(range(n))
    head, tail = list(range(limit - 2)), [n - 2, n - 1]
    if must is not None and 0 <= must < n and must not in head + tail:
        head[-1] = must
        head.sort()
    return head + tail


@pytest.fixture(scope="module")
def service() -> Service:
    return Service(Settings(max_tokens=128))


def explain(service: Service, layer: int, head: int, token: int | None, arrays: str) -> dict:
    return json.loads(service.explain_body(ExplainRequest(TEXT, None, None, None, True, layer, head, token, arrays),
                                           STOP))


@pytest.mark.parametrize(("layer", "head", "token"), [(3, 7, 4), (0, 0, None), (5, 11, 84)])
def test_shown_arrays_are_the_full_arrays_cells_the_page_shows(service: Service, layer: int, head: int,
                                                                token: int | None) -> None:
    full, shown = explain(service, layer, head, token, "all"), explain(service, layer, head, token, "shown")
    n = len(full["tokens"])
    assert n == N and shown["tokens"] == full["tokens"] and shown["check"] == full["check"]
    assert [s["stage"] for s in shown["steps"]] == [s["stage"] for s in full["steps"]]
    for f, s in zip(full["steps"], shown["steps"], strict=True):
        assert {k: s[k] for k in ("number", "title", "text", "shape")} == {k: f[k] for k in ("number", "title",
                                                                                          "text", "shape")}
        assert list(s["arrays"]) == list(f["arrays"])
        for name, values in f["arrays"].items():
            whole = np.atleast_2d(np.asarray(values, dtype=np.float64))  # the JSON lists' numbers
            got = s["shown"][name]
            rows_n, cols_n = whole.shape
            assert got["shape"] == [rows_n, cols_n]
            assert got["rows"] == keep(rows_n, 12, token if rows_n == n else None)
            every_key = f["stage"] in KEY_STAGES and cols_n == n
            assert got["cols"] == (None if every_key else keep(cols_n, 64, None))
            flat = whole.ravel()  # the page's rule: Number.isInteger(v) && |v| < 1e6 for every value
            assert got["integers"] == bool(np.all(np.isfinite(flat) & (flat == np.round(flat)) & (abs(flat) < 1e6)))
            cols = list(range(cols_n)) if got["cols"] is None else got["cols"]
            cells = np.atleast_2d(np.asarray(s["arrays"][name], dtype=np.float64))
            np.testing.assert_array_equal(cells, whole[np.ix_(got["rows"], cols)], err_msg=f"{f['stage']}/{name}")


def test_shown_is_small_where_all_is_large(service: Service) -> None:
    stop = STOP
    full = service.explain_body(ExplainRequest(TEXT, None, None, None, True, 2, 3, 50, "all"), stop)
    shown = service.explain_body(ExplainRequest(TEXT, None, None, None, True, 2, 3, 50, "shown"), stop)
    assert len(shown) < len(full) / 3, (len(shown), len(full))


def block_arrays(block: dict) -> dict[str, np.ndarray]:
    """A JSON neuron block's stages as float32 arrays (as the page's data.js splits them)."""
    raw = base64.b64decode(block["data"])
    raw = zlib.decompress(raw) if block["encoding"].endswith("+zlib") else raw
    flat, at, out = np.frombuffer(raw, "<f4"), 0, {}
    n, d = N, block["d_head"]
    for s in block["stages"]:
        size = n * d if s in ("q", "k", "v", "context") else n * n
        out[s] = flat[at:at + size]
        at += size
    assert at == flat.size
    return out


def neuron_pair(service: Service, layer: int, head: int) -> tuple[dict, tuple[dict, dict[str, np.ndarray]]]:
    req = NeuronRequest(TEXT, None, None, None, True, layer, head)
    json_block = json.loads(service.neuron_body(req, STOP))
    raw = service.neuron_body(NeuronRequest(TEXT, None, None, None, True, layer, head, binary=True), STOP)
    return json_block, binary.decode(raw)


@pytest.mark.parametrize(("layer", "head"), [(0, 0), (4, 9)])
def test_binary_neuron_block_is_the_json_block(service: Service, layer: int, head: int) -> None:
    block, (header, arrays) = neuron_pair(service, layer, head)
    assert {k: header[k] for k in ("layer", "head", "scaling", "d_head", "kv_head", "stages")} == \
        {k: block[k] for k in ("layer", "head", "scaling", "d_head", "kv_head", "stages")}
    want = block_arrays(block)
    assert list(arrays) == block["stages"]
    for s in block["stages"]:
        assert header["arrays"][s]["dtype"] == "float32"
        assert arrays[s].tobytes() == want[s].tobytes(), s


def test_binary_neuron_block_from_the_kept_x_is_the_full_traces() -> None:
    service = Service(Settings(max_tokens=128))
    req = TraceRequest(TEXT, None, None, None, True, (), "base64", True, (), maps="lazy")
    service.trace_body(req, STOP)  # streamed (attnscope.tracing.streamed): its maps and x are kept, not the trace
    service.entry(req, STOP)  # the full trace, cached
    cached = neuron_pair(service, 2, 5)[1]
    service.cache.clear()  # as a long trace: only the maps and the kept x stay
    misses = service.cache.misses
    recomputed = neuron_pair(service, 2, 5)[1]
    assert service.cache.misses == misses  # no forward pass
    assert cached[0] == recomputed[0]
    for s, a in cached[1].items():
        assert a.tobytes() == recomputed[1][s].tobytes(), s
