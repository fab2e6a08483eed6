"""The page's lazy trace from a streamed trace (Service.streamed_body, attnscope.tracing.streamed): the same answer,
byte for byte, as from the whole trace, the same uint8 maps and the same rows kept for the Neuron tab; which requests
take it; and its follow-ups answered from the kept rows as before (tests/serve/test_serve_rows.py)."""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
import pytest

import attnscope
from attnscope.serve import maps
from attnscope.serve.api import NeuronRequest, TraceRequest
from attnscope.serve.pool import Cancelled
from attnscope.serve.service import Service
from attnscope.serve.settings import Settings
from attnscope.verify.check import LayerCheck

TEXT = " ".join(["The old lighthouse keeper watched the storm roll in across the bay, counting waves."] * 12)
MIB = 2**20


def request(model: str | None, mode: str = "lazy", sources: tuple[str, ...] = ()) -> TraceRequest:
    return TraceRequest(TEXT, None, model, None, True, (), "base64", True, sources, maps=mode)


def streamed_and_whole(service: Service, req: TraceRequest) -> tuple[bytes, bytes, maps.MapSet, maps.MapSet]:
    """The answer and kept maps from the streamed path, then from the whole trace (the streamed path switched off)."""
    stop = threading.Event()
    assert service.streams(req, ())
    a = service.trace_body(req, stop)
    key = service.key(req)[1]
    kept_a = service.maps.get(maps.trace_id(key))
    assert kept_a is not None and not service.cache.peek(key)  # the streamed trace itself is not cached
    service.maps.clear()
    service.streams = lambda req, optional: False  # type: ignore[method-assign]
    b = service.trace_body(req, stop)
    kept_b = service.maps.get(maps.trace_id(key))
    assert kept_b is not None
    return a, b, kept_a, kept_b


def test_minilms_streamed_answer_is_the_whole_traces_byte_for_byte(minilm: attnscope.Model) -> None:
    same_answer(None)


def test_smollm2s_streamed_answer_is_the_whole_traces_byte_for_byte(smollm2: attnscope.Model) -> None:
    same_answer("smollm2")


def same_answer(model: str | None) -> None:
    service = Service(Settings(models=(model,) if model else (), max_tokens=256, cache_bytes=1024 * MIB))
    a, b, kept_a, kept_b = streamed_and_whole(service, request(model))
    assert a == b
    body = json.loads(a)
    assert body["check"]["ok"] and body["payload"]["maps"]["stored"]
    assert list(kept_a.sources) == list(kept_b.sources) == ["weights"]
    for field in ("codes", "scales", "view"):
        assert np.array_equal(getattr(kept_a.sources["weights"], field), getattr(kept_b.sources["weights"], field))
    assert kept_a.rows is not None and kept_b.rows is not None
    assert kept_a.rows.stages == kept_b.rows.stages and kept_a.nbytes == kept_b.nbytes
    for stage, array in kept_b.rows.trace.arrays.items():
        assert np.array_equal(kept_a.rows.trace.arrays[stage], array)
    assert kept_a.words == kept_b.words or (kept_a.words is not None and kept_b.words is not None and
                                            kept_a.words.groups == kept_b.words.groups)


def test_which_requests_stream(minilm: attnscope.Model) -> None:
    service = Service(Settings(max_tokens=512, cache_bytes=1024 * MIB))
    assert service.streams(request(None, "lazy"), ())
    assert not service.streams(request(None, "lazy", ("rollout",)), ("rollout",))  # derived maps read every layer
    assert not service.streams(request(None, "auto"), ())  # a short trace's maps go inline
    long = TraceRequest(" ".join([TEXT] * 4), None, None, 512, True, (), "base64", True, (), maps="auto")
    assert service.token_count(long) == 512 and service.streams(long, ())  # past 2^24 weights: lazy, streamed
    service.entry(request(None, "lazy"), threading.Event())  # cached: its answer is built from the cached trace
    assert not service.streams(request(None, "lazy"), ())


def test_asked_again_the_answer_comes_from_the_map_store(minilm: attnscope.Model) -> None:
    service = Service(Settings(max_tokens=256, cache_bytes=1024 * MIB))
    stop = threading.Event()
    first = service.trace_body(request(None), stop)
    misses = service.cache.misses
    assert service.trace_body(request(None), stop) == first and service.cache.misses == misses


def test_a_streamed_traces_neuron_answers_come_from_its_rows(minilm: attnscope.Model) -> None:
    """/api/neuron after a streamed trace: recomputed from the kept x (no forward pass), equal to the answer from
    the whole trace."""
    service = Service(Settings(max_tokens=256, cache_bytes=1024 * MIB))
    stop = threading.Event()
    service.trace_body(request(None), stop)
    ask = NeuronRequest(TEXT, None, None, None, True, 3, 5)
    misses = service.cache.misses
    from_rows = service.neuron_body(ask, stop)
    assert service.cache.misses == misses  # no trace asked of the cache: answered from the rows
    service.entry(request(None), stop)  # the whole trace, cached: answered from it
    assert service.neuron_body(ask, stop) == from_rows


def test_a_client_gone_mid_trace_stops_it_between_two_layers(minilm: attnscope.Model,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The stop set while layer 2's maps are kept (a client gone, a deadline passed): the forward pass ends once
    layer 3 is checked, before its maps are kept; nothing is stored, the model's lock is free, and the next request
    is answered in full."""
    service = Service(Settings(max_tokens=256, cache_bytes=1024 * MIB))
    m, key = service.key(request(None))
    stop = threading.Event()
    added: list[int] = []
    checked: list[int] = []
    add, verify = maps.Compactor.add, LayerCheck.verify

    def adding(self: maps.Compactor, layer: int, weights: Any) -> None:
        added.append(layer)
        add(self, layer, weights)
        if layer == 2:
            stop.set()

    def verifying(self: LayerCheck, layer: int, *args: Any) -> None:
        checked.append(layer)
        verify(self, layer, *args)

    monkeypatch.setattr(maps.Compactor, "add", adding)
    monkeypatch.setattr(LayerCheck, "verify", verifying)
    with pytest.raises(Cancelled):
        service.trace_body(request(None), stop)
    assert added == checked[:3] == [0, 1, 2] and checked == [0, 1, 2, 3]  # layer 3 checked, its maps never kept
    assert m.n_layers > 4 and service.maps.get(maps.trace_id(key)) is None and not service.cache.peek(key)
    lock = service._locks[id(m)]
    assert lock.acquire(blocking=False)
    lock.release()
    added.clear()
    body = json.loads(service.trace_body(request(None), threading.Event()))
    assert body["check"]["ok"] and added == list(range(m.n_layers))
