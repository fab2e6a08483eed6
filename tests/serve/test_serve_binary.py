"""`POST /api/trace` as binary (Accept: application/x-attnscope-arrays) on a real server: the same float32
numbers bit for bit as its base64 JSON, a layout a browser reads without copying, JSON clients unchanged."""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

import attnscope
from attnscope.serve import binary
from attnscope.views.payload import quantize
from tests.support.serve import Server

TEXT = "The cat <b>sat</b> on the mat."
STAGES = ["weights", "q", "scores", "context"]


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def trace_of(http: httpx.Client, accept: str | None, **extra: object) -> httpx.Response:
    headers = {"accept": accept} if accept else {}
    return http.post("/api/trace", json={"text": TEXT, "stages": STAGES, **extra}, headers=headers)


def test_binary_arrays_are_the_json_arrays_bit_for_bit(http: httpx.Client, minilm: attnscope.Model) -> None:
    as_json = trace_of(http, "application/json")
    as_binary = trace_of(http, f"application/json;q=0.5, {binary.MEDIA_TYPE}")
    assert as_binary.headers["content-type"] == binary.MEDIA_TYPE and "Accept" in as_binary.headers["vary"]
    header, arrays = binary.decode(as_binary.content)
    data = as_json.json()
    assert {k: v for k, v in header.items() if k != "arrays"} == {k: v for k, v in data.items() if k != "arrays"}
    local = attnscope.trace(TEXT, model=minilm)
    for name in STAGES:
        sent = data["arrays"][name]
        exact = np.frombuffer(base64.b64decode(sent["data"]), dtype="<f4").reshape(sent["shape"])
        assert arrays[name].tobytes() == exact.tobytes() and header["arrays"][name]["axes"] == sent["axes"]
        assert arrays[name].shape == local.arrays[name].shape
    assert np.abs(arrays["weights"] - local.weights).max() <= 1e-5  # and they are this text's weights


def test_layout_is_aligned_for_typed_arrays(http: httpx.Client) -> None:
    body = trace_of(http, binary.MEDIA_TYPE).content
    (size,) = struct.unpack_from("<I", body, 8)
    assert body[:8] == b"ATNSARR1" and (16 + size) % 8 == 0
    header, _ = binary.decode(body)
    for spec in header["arrays"].values():
        assert spec["offset"] % 8 == 0 and spec["nbytes"] == 4 * int(np.prod(spec["shape"]))
    last = max(header["arrays"].values(), key=lambda s: s["offset"])
    assert len(body) - 16 - size - last["offset"] - last["nbytes"] < 8  # nothing after the buffer but padding


def test_json_clients_are_unchanged_and_the_payload_travels_too(http: httpx.Client) -> None:
    for accept in (None, "*/*", "application/json", f"{binary.MEDIA_TYPE};q=0"):
        r = trace_of(http, accept)
        assert r.headers["content-type"].startswith("application/json") and r.json()["arrays"]["q"]["encoding"]
    header, _ = binary.decode(trace_of(http, binary.MEDIA_TYPE, payload=True).content)
    assert header["payload"]["format"] == "attnscope.views/1"


def test_errors_stay_json(http: httpx.Client) -> None:
    r = http.post("/api/trace", json={"text": ""}, headers={"accept": binary.MEDIA_TYPE})
    assert r.status_code == 422 and r.headers["content-type"].startswith("application/json") and r.json()["error"]


def test_accept_parsing() -> None:
    assert binary.accepts(binary.MEDIA_TYPE) and binary.accepts(f"text/html, {binary.MEDIA_TYPE.upper()}; q=0.2")
    assert not binary.accepts(None) and not binary.accepts("*/*") and not binary.accepts(f"{binary.MEDIA_TYPE};q=0")
    with pytest.raises(ValueError, match="not an application/x-attnscope-arrays body"):
        binary.decode(b'{"arrays": {}}')


def test_float16_is_numpys_float16_of_the_float32_bit_for_bit(http: httpx.Client) -> None:
    header, exact = binary.decode(trace_of(http, binary.MEDIA_TYPE).content)
    explicit = binary.decode(trace_of(http, binary.MEDIA_TYPE, precision="float32").content)[1]
    assert all(explicit[n].tobytes() == exact[n].tobytes() for n in STAGES)  # float32 is the default, exact
    assert {s["dtype"] for s in header["arrays"].values()} == {"float32"}
    header, half = binary.decode(trace_of(http, binary.MEDIA_TYPE, precision="float16").content)
    for name in STAGES:
        spec = header["arrays"][name]
        assert spec["dtype"] == "float16" and spec["nbytes"] == 2 * exact[name].size
        assert half[name].dtype == np.float16 and half[name].tobytes() == exact[name].astype(np.float16).tobytes()


def test_uint8_maps_decode_within_half_a_step(http: httpx.Client) -> None:
    _, exact = binary.decode(trace_of(http, binary.MEDIA_TYPE).content)
    header, sent = binary.decode(trace_of(http, binary.MEDIA_TYPE, precision="uint8").content)
    assert header["arrays"]["weights"]["dtype"] == "uint8"
    spec, w = header["arrays"]["weights"], exact["weights"]  # [layer, head, query, key]
    scales = np.asarray(spec["scales"]).reshape(w.shape[:-2])
    assert spec["nbytes"] == w.size and np.array_equal(scales, w.max(axis=(-2, -1)))  # one scale per map
    step = scales[..., None, None] / 255.0
    assert (np.abs(sent["weights"].astype(np.float64) - w) <= step / 2 * (1 + 1e-6)).all()
    assert np.abs(sent["weights"] - w).max() > 0  # it is quantized, not exact
    for name in ("q", "scores", "context"):  # not the views' maps (scores go below 0): float16
        assert header["arrays"][name]["dtype"] == "float16"
        assert sent[name].tobytes() == exact[name].astype(np.float16).tobytes()


def test_precision_refusals() -> None:
    for bad, precision in ((np.full((1, 2, 2), np.nan), "uint8"), (np.full((2, 2), 7e4), "float16")):
        with pytest.raises(attnscope.AttnscopeError, match=f"precision '{precision}' .* ask for precision 'float32'"):
            binary.encode({}, {"weights": (bad, ("head", "query", "key")[-bad.ndim:])}, precision)
    for bad_value in (np.nan, np.inf, -1e-9):  # in one map of one part: refused, never clipped
        parts = [np.full((2, 3, 3), 0.5, np.float32) for _ in range(3)]
        parts[2][1, 0, 2] = bad_value
        with pytest.raises(attnscope.AttnscopeError, match="'weights' has NaN, infinite or negative values"):
            binary.encode({}, {"weights": (binary.Parts(parts), AXES)}, "uint8")


AXES = ("layer", "head", "query", "key")


def test_float16_is_numpys_rounding_at_the_edges() -> None:
    edges = np.array([0.0, -0.0, 1e-8, 2.98e-8, 3e-8, 5.96e-8, 6e-8, 6.1e-5, 1 / 3, 2049.0, 2051.0, 65504.0, 65519.0,
                      -65519.0, np.nan, np.inf, -np.inf], dtype=np.float32)  # subnormals, ties, the largest finite
    rng = np.random.default_rng(7)
    for a in (edges, (rng.standard_normal(3 * 5 * 7) * 1000).astype(np.float32)):
        half = binary.decode(binary.encode({}, {"q": (a, ("token",))}, "float16"))[1]["q"]
        assert half.view(np.uint16).tobytes() == a.astype(np.float16).view(np.uint16).tobytes()
    for big in (65520.0, -1e6):  # finite in float32, infinite in float16: refused, never clipped
        with pytest.raises(attnscope.AttnscopeError, match="cannot hold 'q'"):
            binary.encode({}, {"q": (np.array([1.0, big], np.float32), ("token",))}, "float16")


def test_uint8_of_parts_is_uint8_of_the_stacked_array_and_the_views_codes(minilm: attnscope.Model) -> None:
    """The server quantizes a fresh trace's maps where they lie in the batch, one view per layer."""
    tr = attnscope.trace(TEXT, model=minilm)
    parts = binary.Parts(tr.arrays.layer_parts("weights"))  # type: ignore[attr-defined]
    assert "weights" in tr.arrays.pending()  # type: ignore[attr-defined]  # nothing was laid out
    from_parts = binary.encode({}, {"weights": (parts, AXES)}, "uint8")
    stacked = tr.arrays["weights"]  # [layer, head, query, key], laid out now
    assert from_parts == binary.encode({}, {"weights": (stacked, AXES)}, "uint8")
    header, _ = binary.decode(from_parts)
    codes, scales = quantize(stacked)  # the views' payload codes
    start = len(from_parts) - header["arrays"]["weights"]["nbytes"]
    assert from_parts[start:] == codes.tobytes() and header["arrays"]["weights"]["scales"] == scales.ravel().tolist()
    for precision in ("float32", "float16"):  # the other precisions join the parts first
        assert binary.encode({}, {"weights": (parts, AXES)}, precision) == \
            binary.encode({}, {"weights": (stacked, AXES)}, precision)


def test_precision_is_for_binary_only_and_validated(http: httpx.Client) -> None:
    plain, half = trace_of(http, "application/json").json(), trace_of(http, None, precision="uint8").json()
    assert half["arrays"] == plain["arrays"] and half["arrays"]["weights"]["dtype"] == "float32"  # JSON: float32
    r = trace_of(http, binary.MEDIA_TYPE, precision="int4")
    assert r.status_code == 422 and "precision" in r.json()["error"]


def test_uint8_derived_maps_have_one_scale_per_map(http: httpx.Client) -> None:
    body = {"text": TEXT, "stages": ["rollout", "flow"]}  # [layer, query, key] and one [query, key]
    exact = binary.decode(http.post("/api/trace", json=body, headers={"accept": binary.MEDIA_TYPE}).content)[1]
    header, sent = binary.decode(http.post("/api/trace", json=body | {"precision": "uint8"},
                                           headers={"accept": binary.MEDIA_TYPE}).content)
    for name, x in exact.items():
        spec = header["arrays"][name]
        scales = np.asarray(spec["scales"]).reshape(*x.shape[:-2], 1, 1)
        assert spec["dtype"] == "uint8" and len(spec["scales"]) == int(np.prod(x.shape[:-2]))
        assert (np.abs(sent[name].astype(np.float64) - x) <= scales / 510 * (1 + 1e-6)).all()
