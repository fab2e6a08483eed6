"""A long trace's Neuron tab and cell explanation without the whole exact trace (attnscope.serve.rows), and the
refusal up front of a long trace whose maps would not fit --cache-size (issue 29, item 4).

The answers recomputed from the kept x are compared byte for byte with the answers built from the full trace
(the same JSON: every float32 of q, k, v, scores, weights, context and output equal), on MiniLM at 512 tokens
(past the 2^24 weights where "auto" goes lazy) and SmolLM2 at 300 tokens ("lazy" asked for)."""

from __future__ import annotations

import threading
import time

import pytest

import attnscope
from attnscope.errors import AttnscopeError
from attnscope.serve import maps
from attnscope.serve.api import ExplainRequest, NeuronRequest, TraceRequest
from attnscope.serve.service import Service
from attnscope.serve.settings import Settings

TEXT = " ".join(["The old lighthouse keeper watched the storm roll in across the bay, counting waves."] * 60)
MIB = 2**20


def trace_request(n: int, model: str | None = None, sources: tuple[str, ...] = (), mode: str = "auto") -> TraceRequest:
    return TraceRequest(TEXT, None, model, n, True, (), "base64", True, sources, maps=mode)


def answers(service: Service, n: int, picks: list[tuple[int, int, int | None]], model: str | None = None,
            ) -> tuple[list[bytes], float]:
    """/api/explain's and /api/neuron's bodies for each (layer, head, token), and the slowest neuron answer's s."""
    stop = threading.Event()
    out, slowest = [], 0.0
    for layer, head, token in picks:
        out.append(service.explain_body(ExplainRequest(TEXT, None, model, n, True, layer, head, token), stop))
        t0 = time.perf_counter()
        out.append(service.neuron_body(NeuronRequest(TEXT, None, model, n, True, layer, head), stop))
        slowest = max(slowest, time.perf_counter() - t0)
    return out, slowest


def same_from_rows(service: Service, n: int, picks: list[tuple[int, int, int | None]],
                   model: str | None = None, mode: str = "auto") -> tuple[float, float]:
    """Trace lazily (streamed: only its maps and x stay), answer from the kept x with no forward pass, then trace the
    whole text and answer from the cached full trace: the same bytes. Returns the seconds of the trace and of the
    slowest neuron answer from x."""
    req = trace_request(n, model, mode=mode)
    t0 = time.perf_counter()
    service.trace_body(req, threading.Event())
    traced = time.perf_counter() - t0
    key = service.key(req)[1]
    kept = service.maps.get(maps.trace_id(key))
    assert kept is not None and kept.rows is not None and not service.cache.peek(key)
    misses = service.cache.misses
    recomputed, took = answers(service, n, picks, model)
    assert service.cache.misses == misses and not service.cache.peek(key)  # no forward pass ran
    service.entry(req, threading.Event())
    full, _ = answers(service, n, picks, model)
    for a, b in zip(full, recomputed, strict=True):
        assert a == b
    return traced, took


@pytest.mark.slow  # two traces of 512 tokens, ~9 s: in `make test`, not the inner loop
def test_minilm_512_neuron_and_explain_from_x_equal_the_full_trace_bit_for_bit() -> None:
    service = Service(Settings(max_tokens=512, cache_bytes=1024 * MIB))
    picks = [(0, 0, 7), (5, 11, 0), (3, 4, 511)]
    traced, took = same_from_rows(service, 512, picks)
    assert took < traced / 2  # loose: one layer's recompute against a whole forward pass and check


def test_a_bad_layer_or_head_on_the_rows_path_is_the_full_paths_error() -> None:
    service = Service(Settings(max_tokens=512, cache_bytes=1024 * MIB))
    stop = threading.Event()
    service.trace_body(trace_request(512), stop)  # streamed: its maps and x kept
    service.entry(trace_request(512), stop)  # the full trace, cached
    errors = []
    for cached in (True, False):
        if not cached:
            service.cache.clear()
        for layer, head in ((6, 0), (0, 12)):
            with pytest.raises(AttnscopeError) as info:
                service.neuron_body(NeuronRequest(TEXT, None, None, 512, True, layer, head), stop)
            errors.append(str(info.value))
    assert errors[:2] == errors[2:]


def test_smollm2_neuron_and_explain_from_x_equal_the_full_trace(smollm2: attnscope.Model) -> None:
    service = Service(Settings(models=("smollm2",), max_tokens=300, cache_bytes=1024 * MIB))
    same_from_rows(service, 300, [(0, 0, 299), (29, 8, 150)], "smollm2", mode="lazy")


def test_maps_over_the_cache_size_are_refused_before_tracing_with_advice() -> None:
    # MiniLM at 512 tokens: weights 6 x 12 x 512 x 512 = 18 MiB of uint8, norm_head as much, rollout 1.5 MiB
    service = Service(Settings(max_tokens=512, cache_bytes=32 * MIB))
    with pytest.raises(AttnscopeError) as info:
        service.trace_body(trace_request(512, sources=("norm_head", "rollout")), threading.Event())
    message = str(info.value)
    assert info.value.parameter == "sources"
    assert "maps do not fit the server's map cache" in message and "38 MiB" in message
    assert "--cache-size of 32 MiB" in message and "'norm_head'" in message
    assert "'rollout'" not in message.split("leave out")[1].split("(")[0]  # dropping norm_head alone fits
    assert service.cache.misses == 0 and service.cache.stats()["entries"] == 0  # refused before any forward pass
    # as advised: the weights and rollout fit, and are kept
    body = service.trace_body(trace_request(512, sources=("rollout",)), threading.Event())
    assert b'"stored":true' in body


def test_maps_of_the_weights_alone_over_the_cache_size_advise_a_larger_cache() -> None:
    service = Service(Settings(max_tokens=512, cache_bytes=16 * MIB))
    advice = r"start the server with --cache-size 33 or more, .* count 14 MiB kept"
    with pytest.raises(AttnscopeError, match=advice) as info:
        service.trace_body(trace_request(512), threading.Event())
    assert "leave out" not in str(info.value)


def test_short_inline_traces_are_not_refused() -> None:
    service = Service(Settings(max_tokens=512, cache_bytes=16 * MIB))
    body = service.trace_body(trace_request(64, sources=("norm_head",)), threading.Event())
    assert b'"payload"' in body
