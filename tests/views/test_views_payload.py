"""The views' payload against the trace it describes: quantized maps, exact neuron numbers, selection, errors."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable

import numpy as np
import pytest

import attnscope
from attnscope.errors import AttnscopeError
from attnscope.rollout import rollout
from attnscope.tracing.one_pass import Trace, trace
from attnscope.views import neuron_block, payload
from attnscope.views.payload import NEURON_BUDGET, quantize
from tests.support.views import decode_block, decode_source


def source(data: dict, name: str) -> dict:
    return next(s for s in data["sources"] if s["name"] == name)


def test_weights_decode_within_one_quantization_step(pair_trace: Trace) -> None:
    data = payload(pair_trace)
    spec = source(data, "weights")
    w = pair_trace.weights.astype(np.float64)
    assert spec["shape"] == list(w.shape) and spec["encoding"] == "u8+zlib"
    assert np.array_equal(np.asarray(spec["scales"]).reshape(w.shape[:2]), w.max(axis=(2, 3)))
    step = w.max(axis=(2, 3))[:, :, None, None] / 510  # half a code step of each matrix
    assert np.all(np.abs(decode_source(spec) - w) <= step * (1 + 1e-9))


def test_quantize_hits_every_code_and_keeps_zero_maps_zero() -> None:
    maps = np.linspace(0, 2, 256, dtype=np.float32).reshape(1, 1, 16, 16)
    codes, scales = quantize(np.concatenate([maps, np.zeros_like(maps)], axis=1))
    assert scales.tolist() == [[2.0, 0.0]]
    assert np.array_equal(codes[0, 0].ravel(), np.arange(256))  # 0..2 in 255 steps: code i is i
    assert not codes[0, 1].any()


def test_selection_keeps_original_indices(pair_trace: Trace) -> None:
    data = payload(pair_trace, layers=[3, 1, 3], heads=[2, 7], compress=False)
    spec = source(data, "weights")
    assert data["layers"] == [1, 3] and data["heads"] == [2, 7] and spec["encoding"] == "u8"
    expected = pair_trace.weights[[1, 3]][:, [2, 7]]
    assert np.abs(decode_source(spec) - expected).max() <= expected.max() / 510 + 1e-9
    assert data["initial"]["layer"] == 1 and data["initial"]["heads"] == [2, 7]


def test_neuron_blocks_are_the_trace_numbers_bit_for_bit(pair_trace: Trace) -> None:
    n = pair_trace.n_tokens
    block = decode_block(neuron_block(pair_trace, 4, 9), n)
    for stage in ("q", "k", "scores", "weights"):
        assert np.array_equal(block[stage], pair_trace.arrays[stage][4, 9]), stage
    assert neuron_block(pair_trace, 4, 9)["scaling"] == pair_trace.scaling[4]


def test_neuron_budget_and_choices(pair_trace: Trace) -> None:
    start = {"layer": 2, "head": 5}
    small = payload(pair_trace, initial=start)["neuron"]
    assert small["complete"] and len(small["blocks"]) == 72  # a short text fits the budget
    assert (small["blocks"][0]["layer"], small["blocks"][0]["head"]) == (2, 5)  # the starting head first
    assert payload(pair_trace, neuron="none")["neuron"]["blocks"] == []
    chosen = payload(pair_trace, neuron=[(0, 1), (5, 11)])["neuron"]
    assert [(b["layer"], b["head"]) for b in chosen["blocks"]] == [(0, 1), (5, 11)] and not chosen["complete"]
    per_head = sum(pair_trace.arrays[s][0, 0].nbytes for s in ("q", "k", "scores", "weights"))
    assert per_head * 72 <= NEURON_BUDGET
    with pytest.raises(AttnscopeError, match="head 12 is out of range"):
        payload(pair_trace, neuron=[(0, 12)])


def test_every_query_key_array_is_a_source_weights_first(pair_trace: Trace) -> None:
    tr = copy.copy(pair_trace)
    tr.arrays = dict(pair_trace.arrays, rollout=rollout(pair_trace.weights))
    tr.arrays.pop("flow", None)
    tr.arrays["flow"] = tr.arrays["rollout"][-1]  # any [query, key] map will do: the layout is what is tested
    data = payload(tr)
    names = [s["name"] for s in data["sources"]]
    assert names[0] == "weights" and {"rollout", "flow"} <= set(names) and "scores" not in names
    roll, flow = source(data, "rollout"), source(data, "flow")
    assert roll["shape"] == [6, 1, tr.n_tokens, tr.n_tokens] and roll["heads"] == []
    assert roll["layers"] == list(range(6))
    assert flow["shape"] == [1, 1, tr.n_tokens, tr.n_tokens] and flow["layers"] == [] and flow["range"] == "max"
    assert np.abs(decode_source(roll)[:, 0] - tr.arrays["rollout"]).max() <= tr.arrays["rollout"].max() / 510 + 1e-9


def test_nan_and_negative_maps_are_refused_not_patched(pair_trace: Trace) -> None:
    tr = copy.copy(pair_trace)
    weights = pair_trace.weights.copy()
    weights[2, 3, 4, 5] = np.nan
    tr.arrays = dict(pair_trace.arrays, weights=weights)
    with pytest.raises(AttnscopeError, match=r"'weights': it holds nan at layer 2, head 3, query 4, key 5"):
        payload(tr)
    tr.arrays = dict(pair_trace.arrays, flow=-np.ones((tr.n_tokens, tr.n_tokens), dtype=np.float32))
    with pytest.raises(AttnscopeError, match=r"'flow': it holds -1.0 at query 0, key 0"):
        payload(tr)


def test_payload_is_strict_json_with_the_check(pair_trace: Trace) -> None:
    data = payload(pair_trace, layers=[0, 5], heads=[1, 4])
    text = json.dumps(data, allow_nan=False)
    report = pair_trace.check()
    check = json.loads(text)["check"]
    assert check["ok"] == report.ok and check["tolerance"] == report.tolerance
    assert check["head_errors"] == [[report.head_error(layer, head) for head in (1, 4)] for layer in (0, 5)]
    assert data["tokens"] == pair_trace.token_strings and data["segments"] == [t.segment for t in pair_trace.tokens]


@pytest.mark.parametrize(("initial", "message"), [
    ({"layer": 4}, r"layer 4 is not in this view: it shows layers \[0, 1\]"),
    ({"head": 12}, "head 12 is not in this view"),
    ({"query": 99}, "token 99 is out of range"),
    ({"theme": "blue"}, "theme 'blue' is not known"),
    ({"colour": 1}, "unknown view option 'colour'"),
    ({"source": "rollout"}, "source 'rollout' is not in this trace"),
])
def test_bad_starting_state_is_one_clear_error(pair_trace: Trace, initial: dict, message: str) -> None:
    with pytest.raises(AttnscopeError, match=message):
        payload(pair_trace, layers=[0, 1], initial=initial)


def test_layers_out_of_range(pair_trace: Trace) -> None:
    expected = r"layer 6 is out of range: this model has 6 layers, valid values are 0\.\.5"
    with pytest.raises(AttnscopeError, match=expected):
        payload(pair_trace, layers=[6])
    with pytest.raises(AttnscopeError, match="no layers or no heads selected"):
        payload(pair_trace, heads=[])


def test_no_badge_without_an_independent_recompute(tiny_model: Callable[[str], attnscope.Model]) -> None:
    tr = trace("the cat sat on the mat", model=tiny_model("starcoder2"))  # a family without a recompute adapter
    check = payload(tr)["check"]
    assert check["ok"] is None and check["status"] == "NOT VERIFIED"
    assert check["unsupported"].startswith("no attnscope adapter for model type 'starcoder2' (Starcoder2Model)")
    assert check["max_error"] == tr.check().max_error  # what was compared: capture vs the model's own weights
