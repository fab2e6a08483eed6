"""A streamed trace (attnscope.tracing.streamed): each layer checked inside the forward pass and its weights handed
on and let go. Held to forward_pass(...).finish() on the real MiniLM and SmolLM2 and on every modern family's tiny
random model: the same check, comparison for comparison and error for error, the same arrays, the same weights
handed on; a real difference still fails; no layer's weights outlive the layer after it."""

from __future__ import annotations

import dataclasses
import weakref

import numpy as np
import pytest
import torch

import attnscope
from attnscope.tracing import streamed
from attnscope.tracing.one_pass import forward_pass
from attnscope.tracing.streamed import can_stream, streamed_trace
from tests.support.families import build_model, modern_configs
from tests.support.seq2seq import tiny_seq2seq

TEXT = "The old lighthouse keeper watched the storm roll in across the bay, counting the waves as they broke."


def same_as_the_whole_trace(m: attnscope.Model, text: str = TEXT) -> None:
    whole = forward_pass(text, None, model=m).finish()[0]
    handed: dict[int, np.ndarray] = {}
    st = streamed_trace(text, None, m, None, True, lambda layer, w: handed.__setitem__(layer, w.numpy().copy()))
    assert [(c.stage, c.source) for c in st.trace.comparisons] == [(c.stage, c.source) for c in whole.comparisons]
    for a, b in zip(st.trace.comparisons, whole.comparisons, strict=True):
        np.testing.assert_array_equal(a.errors, b.errors)  # NaN in the same places too
    assert ("weights", "model") in {(c.stage, c.source) for c in st.trace.comparisons}  # the module's own weights
    assert st.trace.check().to_dict() == whole.check().to_dict()
    weights = whole.arrays["weights"]
    assert sorted(handed) == list(range(weights.shape[0]))
    for layer, w in handed.items():
        assert np.array_equal(w, weights[layer])
    assert list(st.trace.arrays) == ["x", "context", "output"] and st.stages == tuple(whole.arrays)
    for stage in st.trace.arrays:  # contiguous float32 copies of the text's arrays
        assert st.trace.arrays[stage].flags.c_contiguous and st.trace.arrays[stage].dtype == np.float32
        assert np.array_equal(st.trace.arrays[stage], whole.arrays[stage]), stage
    assert st.trace.model == whole.model and st.trace.tokens == whole.tokens


def test_minilm_streamed_equals_the_whole_trace(minilm: attnscope.Model) -> None:
    same_as_the_whole_trace(minilm)


def test_smollm2_streamed_equals_the_whole_trace(smollm2: attnscope.Model) -> None:
    same_as_the_whole_trace(smollm2, " ".join([TEXT] * 3))


@pytest.mark.parametrize("family", sorted(modern_configs()))
def test_every_modern_family_streamed_equals_the_whole_trace(family: str, minilm: attnscope.Model) -> None:
    m = attnscope.load_model(build_model(modern_configs()[family](), head="ForCausalLM" if family != "modernbert"
                                         else ""), tokenizer=minilm.tokenizer)
    assert can_stream(m)
    same_as_the_whole_trace(m)


def test_a_real_difference_still_fails(minilm: attnscope.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recompute reads layer 2's W_Q off by 1e-3 in one entry: the streamed check FAILs there, with the errors
    the whole trace's check finds from the same weights."""
    real = streamed.layer_params

    def off(model: torch.nn.Module, n: int) -> list:  # type: ignore[type-arg]
        params = real(model, n)
        assert params is not None
        w_q = params[2].w_q.clone()
        w_q[0, 0] += 1e-3
        return [dataclasses.replace(p, w_q=w_q) if i == 2 else p for i, p in enumerate(params)]

    monkeypatch.setattr(streamed, "layer_params", off)
    st = streamed_trace(TEXT, None, minilm, None, True, lambda layer, w: None)
    report = st.trace.check()
    assert not report.ok
    failing = {(c.stage, layer) for c in st.trace.comparisons if c.source == "recompute"
               for layer in np.nonzero(np.nanmax(c.errors, axis=-1) > 1e-5)[0].tolist()}
    assert ("q", 2) in failing and all(layer == 2 for _, layer in failing)


def test_no_layers_weights_outlive_the_next_layer(smollm2: attnscope.Model) -> None:
    """Each handed-on layer's weights are gone (nothing refers to them) by the time the layer after next is handed
    on: the forward pass never holds more than two layers of them."""
    alive: list[weakref.ref[torch.Tensor]] = []
    late: list[int] = []

    def sink(layer: int, w: torch.Tensor) -> None:
        late.extend(i for i, ref in enumerate(alive[:-1]) if ref() is not None)
        alive.append(weakref.ref(w._base if w._base is not None else w))

    streamed_trace(" ".join([TEXT] * 3), None, smollm2, None, True, sink)
    assert len(alive) == smollm2.n_layers and late == []
    assert all(ref() is None for ref in alive)


def test_encoder_decoders_are_not_streamed(minilm: attnscope.Model) -> None:
    assert not can_stream(tiny_seq2seq("t5", minilm))
