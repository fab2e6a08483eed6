"""LayerMixing (attribution.mixing): rollout of per-layer matrices, the verdict and the row normalisation; the
rolled rows a target reads (attribution.attention.rolled_rows)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import attnscope
from attnscope.attribution.attention import rolled_rows, rows
from attnscope.attribution.mixing import LayerMixing, normalise_rows, verdict
from attnscope.attribution.objective import ENCODER, build_objective
from attnscope.rollout import residual_attention, rollout


def mixing(matrices: np.ndarray) -> LayerMixing:
    return LayerMixing("alti", matrices, np.zeros(len(matrices)), 1e-5, True, "test", 1)


def test_rolled_is_attention_rollout_for_the_residual_attention_matrices() -> None:
    rng = np.random.default_rng(0)
    weights = rng.random((4, 3, 5, 5))  # [layer, head, query, key]
    weights /= weights.sum(-1, keepdims=True)
    m = mixing(residual_attention(weights))
    assert np.abs(m.rolled() - rollout(weights)[-1]).max() <= 1e-12
    assert m.layers == 4 and m.tokens == 5


def test_rolled_multiplies_the_later_layer_from_the_left() -> None:
    first = np.array([[1.0, 0.0], [1.0, 0.0]])  # every position takes all of token 0
    second = np.array([[0.0, 1.0], [0.0, 1.0]])  # every position takes all of position 1
    assert (mixing(np.stack([first, second])).rolled() == second @ first).all()
    assert not (mixing(np.stack([first, second])).rolled() == first @ second).all()  # the order matters


def test_verdict_and_row_normalisation() -> None:
    assert verdict(np.array([1e-7, 2e-6]), 1e-5) is True
    assert verdict(np.array([1e-7, 2e-5]), 1e-5) is False
    assert verdict(np.array([np.nan, 2e-6]), 1e-5) is True  # one layer unchecked
    assert verdict(np.array([np.nan, np.nan]), 1e-5) is None and verdict(np.array([]), 1e-5) is None
    rows = normalise_rows(np.array([[1.0, 3.0], [0.0, 0.0]]))
    assert (rows == np.array([[0.25, 0.75], [0.0, 0.0]])).all()  # an all-zero row stays zero, not NaN


def test_rolled_rows_are_the_rolled_matrix_rows(minilm: attnscope.Model,
                                                tiny_lm: Callable[[str], attnscope.Model]) -> None:
    """attention.rolled_rows (top layer down, a row block at a time) against rows() of the whole rolled matrix:
    an encoder's mean of the rows and a causal model's predicting positions (a target of two tokens), within float64
    rounding; the layers taken in the other order differ."""
    rng = np.random.default_rng(1)
    for obj in (build_objective(minilm, "Paris is the capital of France."),
                build_objective(tiny_lm("gpt2"), "The capital of France is", " Paris city")):
        n = obj.n_tokens
        matrices = normalise_rows(rng.random((4, n, n)))  # [layer, query, key]
        whole = rows(obj, mixing(matrices).rolled())
        assert whole.shape == (len(obj.positions) if obj.kind != ENCODER else 1, n)
        assert np.abs(rolled_rows(obj, matrices) - whole).max() <= 1e-12
        assert np.abs(rolled_rows(obj, matrices[::-1]) - whole).max() > 1e-3
