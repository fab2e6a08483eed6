"""Norm-based attention: a hand-worked example, and the linearity of the real attention sublayers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import attnscope
from attnscope.errors import AttnscopeError
from attnscope.norms import norm_attention, transformed
from attnscope.tracing.one_pass import Trace, trace
from attnscope.verify.recompute import layer_params

TOL = 1e-5
TEXT = "The cat sat on the mat."

# One layer, two heads of d_head 1, d_model 2, two tokens. Head 0 owns W_O's row 0, head 1 row 1.
V = np.array([[[[1.0], [2.0]], [[3.0], [0.0]]]])  # [layer, head, token, d_head]
W_O = np.array([[1.0, 2.0], [3.0, -1.0]])  # [head * d_head, d_model]
ALPHA = np.array([[[[0.5, 0.5], [1.0, 0.0]], [[0.25, 0.75], [0.5, 0.5]]]])  # [layer, head, query, key]


def test_norms_match_hand_computed_example() -> None:
    # f^0(x_j) = v_j [1, 2]: [1, 2], [2, 4] (norms sqrt5, 2 sqrt5); f^1(x_j) = v_j [3, -1]: [9, -3], [0, 0]
    out = norm_attention(V, ALPHA, [W_O])
    s5, s90 = np.sqrt(5), np.sqrt(90)
    expected_head = [[[0.5 * s5, s5], [s5, 0.0]], [[0.25 * s90, 0.0], [0.5 * s90, 0.0]]]
    assert np.abs(out["norm_head"][0] - expected_head).max() <= TOL
    # query 0, key 0: .5 [1, 2] + .25 [9, -3] = [2.75, .25]; query 0, key 1: .5 [2, 4] = [1, 2]
    # query 1, key 0: [1, 2] + .5 [9, -3] = [5.5, .5];       query 1, key 1: 0 [2, 4] + .5 [0, 0] = 0
    expected_layer = [[np.sqrt(7.625), s5], [np.sqrt(30.5), 0.0]]
    assert np.abs(out["norm_layer"][0] - expected_layer).max() <= TOL


def test_transformed_vectors_slice_w_o_by_rows() -> None:
    f = transformed(V[0], W_O)  # [head, key, d_model]
    assert np.array_equal(f, [[[1, 2], [2, 4]], [[9, -3], [0, 0]]])


@pytest.fixture(scope="module")
def minilm_trace(minilm: attnscope.Model) -> Trace:
    return trace(TEXT, model=minilm)


@pytest.fixture(scope="module")
def gpt2_trace(tiny_model: Callable[[str], attnscope.Model]) -> Trace:
    return trace(TEXT, model=tiny_model("gpt2"))


def _linearity_error(tr: Trace, model: attnscope.Model, shuffle_heads: bool = False) -> tuple[float, float]:
    """max |sum_h sum_j alpha^h_ij f^h(x_j) - (output_i - b_O)| over layers and queries, and max |output|."""
    worst = 0.0
    for layer, p in enumerate(layer_params(model.model) or []):
        w_o = p.w_o.numpy()
        if shuffle_heads:  # a wrong decomposition: each head's value read through the next head's W_O rows
            w_o = np.roll(w_o.reshape(p.n_heads, p.d_head, -1), 1, axis=0).reshape(w_o.shape)
        f = transformed(tr.arrays["v"][layer], w_o)  # [head, key, d_model]
        summed = np.einsum("hqk,hkm->qm", tr.weights[layer].astype(np.float64), f)  # [query, d_model]
        without_bias = tr.arrays["output"][layer] - p.b_o.numpy()  # the module's own output, b_O removed
        worst = max(worst, float(np.abs(summed - without_bias).max()))
    return worst, float(np.abs(tr.arrays["output"]).max())


@pytest.mark.parametrize("family", ["minilm", "gpt2"])
def test_attention_output_is_the_sum_of_weighted_transformed_vectors(
    family: str, minilm: attnscope.Model, tiny_model: Callable[[str], attnscope.Model],
    minilm_trace: Trace, gpt2_trace: Trace,
) -> None:
    model, tr = (minilm, minilm_trace) if family == "minilm" else (tiny_model("gpt2"), gpt2_trace)
    error, scale = _linearity_error(tr, model)
    assert error <= TOL
    assert error <= 1e-4 * scale  # relative too: the tiny GPT-2's outputs are small (|output| ~ 0.03)
    wrong, _ = _linearity_error(tr, model, shuffle_heads=True)
    assert wrong > 100 * max(error, 1e-7)  # the check tells a wrong head slicing apart


@pytest.mark.parametrize("family", ["minilm", "gpt2"])
def test_norms_equal_the_norms_of_the_weighted_vectors(
    family: str, minilm: attnscope.Model, tiny_model: Callable[[str], attnscope.Model],
    minilm_trace: Trace, gpt2_trace: Trace,
) -> None:
    model, tr = (minilm, minilm_trace) if family == "minilm" else (tiny_model("gpt2"), gpt2_trace)
    params = layer_params(model.model) or []
    out = norm_attention(tr.arrays["v"], tr.weights, [p.w_o.numpy() for p in params])
    n = tr.n_tokens
    assert out["norm_head"].shape == (tr.n_layers, tr.n_heads, n, n)
    assert out["norm_layer"].shape == (tr.n_layers, n, n)
    for layer, p in enumerate(params):
        f = transformed(tr.arrays["v"][layer], p.w_o.numpy())  # [head, key, d_model]
        weighted = tr.weights[layer][..., None].astype(np.float64) * f[:, None]  # [head, query, key, d_model]
        scale = max(1.0, float(np.linalg.norm(weighted, axis=-1).max()))
        assert np.abs(out["norm_head"][layer] - np.linalg.norm(weighted, axis=-1)).max() <= TOL * scale
        assert np.abs(out["norm_layer"][layer] - np.linalg.norm(weighted.sum(0), axis=-1)).max() <= TOL * scale
    assert (out["norm_layer"] <= out["norm_head"].sum(1) + TOL).all()  # triangle inequality over heads
    if tr.causal:
        assert np.triu(out["norm_layer"], 1).max() == 0.0


def test_norms_are_saved_with_the_trace(minilm: attnscope.Model, minilm_trace: Trace, tmp_path: Path) -> None:
    params = layer_params(minilm.model) or []
    minilm_trace.arrays.update(norm_attention(minilm_trace.arrays["v"], minilm_trace.weights,
                                              [p.w_o.numpy() for p in params]))
    minilm_trace.save(tmp_path / "t.safetensors")
    loaded = Trace.load(tmp_path / "t.safetensors").norms()
    for name, arr in minilm_trace.norms().items():
        assert np.array_equal(loaded[name], arr)


@pytest.mark.parametrize(("v", "alpha", "w_o", "message"), [
    (V, ALPHA, [W_O, W_O], "need one W_O per layer: 1 layers but 2"),
    (V, ALPHA, [W_O.T[:1]], r"W_O must be \[head \* d_head, d_model\] = \[2, d_model\]"),
    (V[:, :1], ALPHA, [W_O], "v must be"),
    (V * np.nan, ALPHA, [W_O], "v holds NaN"),
    (V, ALPHA * np.nan, [W_O], "weights hold NaN"),
])
def test_bad_input_is_an_error(v: np.ndarray, alpha: np.ndarray, w_o: list[np.ndarray], message: str) -> None:
    with pytest.raises(AttnscopeError, match=message):
        norm_attention(v, alpha, w_o)


@pytest.mark.parametrize("family", ["minilm", "gpt2"])
def test_trace_carries_norm_based_attention(
    family: str, minilm: attnscope.Model, tiny_model: Callable[[str], attnscope.Model],
) -> None:
    model = minilm if family == "minilm" else tiny_model("gpt2")
    tr = trace(TEXT, model=model)  # a fresh trace: nothing added by other tests
    w_o = [p.w_o.numpy() for p in layer_params(model.model) or []]
    expected = norm_attention(tr.arrays["v"], tr.weights, w_o)
    for name, arr in tr.norms().items():
        assert arr.dtype == np.float32
        assert np.abs(arr - expected[name]).max() <= TOL
