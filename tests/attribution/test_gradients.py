"""Saliency, input x gradient and integrated gradients (Captum): gradients against finite differences on a
float64 tiny model, completeness, and each check failing on a deliberately wrong computation."""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import pytest
import torch

import attnscope
from attnscope.attribution.api import attribute
from attnscope.attribution.gradients import completeness, finite_difference_check, gradients, scaling_check
from attnscope.attribution.objective import build_objective

TEXT = "the capital of france is"


def test_gradient_equals_finite_differences_float64(tiny_lm: Callable[[str], attnscope.Model]) -> None:
    """Captum's gradient, coordinate by coordinate, against central differences on a float64 copy. Llama's eager
    attention takes its softmax in float32 even in a float64 model, so f is noisy at ~1e-9: h = 1e-3 keeps that
    noise and the h^2 curvature term both under 1e-4 of the gradient (measured: 3e-5)."""
    m32 = tiny_lm("llama")
    m = attnscope.load_model(copy.deepcopy(m32.model).double(), tokenizer=m32.tokenizer)
    obj = build_objective(m, TEXT)
    embeds, grads = gradients(obj)  # [1, token, d], [target, token, d]
    rng = np.random.default_rng(0)
    h = 1e-3
    for token, dim in zip(rng.integers(0, obj.n_tokens, 12), rng.integers(0, embeds.shape[-1], 12), strict=True):
        e = torch.zeros_like(embeds)
        e[0, token, dim] = h
        with torch.no_grad():
            pair = obj.score_embeds(torch.cat([embeds + e, embeds - e]))[:, 0]
        fd = float(pair[0] - pair[1]) / (2 * h)
        assert abs(fd - float(grads[0, token, dim])) <= 1e-4 * max(1.0, abs(fd))


@pytest.mark.parametrize("family", ["gpt2", "llama", "t5", "bart"])
def test_gradient_methods_pass_their_checks(tiny_lm: Callable[[str], attnscope.Model], family: str) -> None:
    a = attribute(TEXT, model=tiny_lm(family), target="paris is",
                  methods="saliency,input_x_gradient,integrated_gradients")
    for name, ms in a.methods.items():
        assert ms.check.verified is True, (name, ms.check)
        assert ms.scores.shape == (2, len(a.tokens)) and ms.scores.dtype == np.float64
    ig = a.methods["integrated_gradients"]
    # completeness, recomputed here from the record: each row sums to f(x) - f(baseline)
    delta = np.array(ig.settings["f_x"]) - np.array(ig.settings["f_baseline"])
    assert np.all(np.abs(ig.scores.sum(axis=1) - delta) <= 0.01 * np.maximum(np.abs(delta), 1e-3))
    assert ig.cost.backwards == sum(ig.settings["steps"]) or ig.cost.backwards >= max(ig.settings["steps"])


def test_wrong_gradients_fail_the_finite_difference_checks(tiny_lm: Callable[[str], attnscope.Model]) -> None:
    obj = build_objective(tiny_lm("gpt2"), TEXT)
    embeds, grads = gradients(obj)
    assert finite_difference_check(obj, embeds, grads).verified is True
    assert finite_difference_check(obj, embeds, grads * 1.1).verified is False  # a 10% too large gradient
    scores = (embeds[0] * grads[0]).double().sum(-1)[None]  # input x gradient by hand: [target, token]
    assert scaling_check(obj, embeds, scores).verified is True
    assert scaling_check(obj, embeds, scores.flip(-1) * 1.2).verified is False


def test_corrupted_integrated_gradients_fail_completeness() -> None:
    row = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    assert completeness(row, 1.0) == 0.0
    assert completeness(row * 1.05, 1.0) == pytest.approx(0.05)  # a corrupted attribution: 5% > 1%
    assert np.isnan(completeness(row * float("nan"), 1.0))  # NaN never passes


def test_integrated_gradients_capped_says_so(minilm: attnscope.Model) -> None:
    a = attribute("time flies like an arrow", model=minilm, methods="integrated_gradients", ig_steps=2,
                  ig_max_steps=2)
    check = a.methods["integrated_gradients"].check
    assert check.verified is False and check.value > 0.01 and "cap of 2 steps" in check.detail
    assert a.status == "FAIL" and a.exit_code == 1
    full = attribute("time flies like an arrow", model=minilm, methods="integrated_gradients")
    ig = full.methods["integrated_gradients"]
    assert ig.check.verified is True and ig.check.value <= 0.01
    assert ig.scores[0, 0] == 0.0 and ig.scores[0, -1] == 0.0  # [CLS] and [SEP] keep their embedding


@pytest.mark.parametrize("steps", [2, 3, 32, 512])
def test_ig_weights_are_the_trapezoid_rule(steps: int) -> None:
    """ig_weights: Captum's alphas (linspace) and the trapezoid rule's weights 1/(n-1), halved at the ends, summing
    to 1; Captum's own sizes, unscaled, sum to 1 - 1/n (the gap trapezoid_fix closes)."""
    from captum.attr._utils.approximation_methods import approximation_parameters

    from attnscope.attribution.gradients import IG_RULE, ig_weights

    weights, alphas = ig_weights(steps)
    expected = np.full(steps, 1.0 / (steps - 1))
    expected[[0, -1]] /= 2
    assert np.allclose(alphas, np.linspace(0, 1, steps), atol=1e-12)
    assert np.abs(weights - expected).max() <= 1e-12 and abs(weights.sum() - 1.0) <= 1e-12
    captum_sizes = np.asarray(approximation_parameters(IG_RULE)[0](steps))
    assert abs(captum_sizes.sum() - (1 - 1 / steps)) <= 1e-12  # the wrong sum, had it not been rescaled
