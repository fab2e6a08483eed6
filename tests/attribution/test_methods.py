"""The registry and the attention-based methods: which methods apply to which family, the rows they read from
the verified trace, their checks (and a corrupted trace failing them), and the one-line refusals."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import attnscope
from attnscope.attribution.api import attribute, make_settings
from attnscope.attribution.attention import trace_check
from attnscope.attribution.methods import METHODS, method_names
from attnscope.errors import AttnscopeError
from attnscope.records.check_report import Comparison

TEXT = "the capital of france is"


def test_minilm_attention_methods_read_the_trace(minilm: attnscope.Model) -> None:
    a = attribute("time flies like an arrow", model=minilm, methods="attention,rollout,flow,alti,norm")
    tr = attnscope.trace("time flies like an arrow", model=minilm)
    # an encoder's pooled embedding weighs every row alike: the mean of the rows
    assert np.allclose(a.scores("attention")[0], tr.weights[-1].mean(axis=0).mean(axis=0), atol=1e-12)
    assert np.allclose(a.scores("rollout")[0], tr.rollout()[-1].mean(axis=0), atol=1e-12)
    assert np.allclose(a.scores("flow")[0], tr.flow().mean(axis=0), atol=1e-12)
    for name, ms in a.methods.items():
        assert ms.check.verified is True, (name, ms.check)
        assert abs(ms.scores.sum() - 1.0) <= 1e-5  # shares of the input: each row sums to 1


def test_smollm2_paris_rows(smollm2: attnscope.Model) -> None:
    a = attribute("The capital of France is", model=smollm2, methods="attention,attention_x_gradient,alti",
                  layer=29, head=2)
    tr = attnscope.trace("The capital of France is", model=smollm2)
    assert np.array_equal(a.scores("attention")[0], tr.weights[29, 2, -1].astype(np.float64))
    assert a.status == "PASS" and a.methods["attention_x_gradient"].settings == {"layer": 29, "head": 2}


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_every_method_on_causal_families(tiny_lm: Callable[[str], attnscope.Model], family: str) -> None:
    a = attribute(TEXT, model=tiny_lm(family), methods="all")
    assert set(a.methods) == set(METHODS) - ({"alti"} if family not in ("gpt2", "llama") else set())
    for name, ms in a.methods.items():
        assert ms.check.verified is True, (name, ms.check)
        assert ms.scores.shape == (1, len(a.tokens)) and ms.cost.forwards >= 1


def test_encoder_decoders_run_what_applies(tiny_lm: Callable[[str], attnscope.Model]) -> None:
    a = attribute(TEXT, model=tiny_lm("bart"), methods="all")
    assert set(a.methods) == {"attention", "rollout", "attention_x_gradient", "saliency", "input_x_gradient",
                              "integrated_gradients", "leave_one_out", "leave_one_out_replaced"}
    assert set(a.skipped) == set(METHODS) - set(a.methods)  # said in the output, with the reason
    assert "max-flow through one stack" in a.skipped["flow"] and "ALTI+" in a.skipped["alti"]
    for name in ("flow", "alti", "norm", "value_zeroing"):
        with pytest.raises(AttnscopeError, match=f"{name} does not apply to .*encoder") as exc:
            attribute(TEXT, model=tiny_lm("t5"), methods=name)
        assert "\n" not in str(exc.value) and exc.value.parameter == "methods"


def test_refusals(minilm: attnscope.Model) -> None:
    with pytest.raises(AttnscopeError, match="unknown attribution method 'ig'") as exc:
        method_names("saliency,ig")
    assert exc.value.parameter == "methods"
    with pytest.raises(AttnscopeError, match=r"saliency does not apply to .*gradient there is 0"):
        attribute("time flies", model=minilm, methods="saliency")
    with pytest.raises(AttnscopeError, match="beyond its budget of max_flow_tokens=3") as exc:
        attribute("time flies like an arrow", model=minilm, methods="flow", max_flow_tokens=3)
    assert exc.value.parameter == "max_flow_tokens"
    with pytest.raises(AttnscopeError, match="budget of max_perturb_tokens=4"):
        attribute("time flies like an arrow", model=minilm, methods="leave_one_out", max_perturb_tokens=4)
    with pytest.raises(AttnscopeError, match="unknown attribution setting 'steps'"):
        attribute("time flies", model=minilm, steps=3)
    for steps, cap in ((64, 32), (1024, None), (None, 16)):  # the first steps beyond the cap, given or default
        given = {k: v for k, v in (("ig_steps", steps), ("ig_max_steps", cap)) if v is not None}
        with pytest.raises(AttnscopeError, match=r"ig_steps=\d+ is more than the step cap") as exc:
            make_settings(**given)
        assert exc.value.parameter == "ig_steps" and "--" not in str(exc.value)
    assert make_settings(ig_steps=32, ig_max_steps=32).ig_steps == 32  # equal is a cap reached, not exceeded
    with pytest.raises(AttnscopeError, match="ig_steps=1: the trapezoid rule needs at least 2 points"):
        make_settings(ig_steps=1)


def test_a_failed_recompute_fails_the_attention_check(minilm: attnscope.Model) -> None:
    tr = attnscope.trace("time flies like an arrow", model=minilm)
    assert trace_check(tr).verified is True
    # captured weights 1e-3 away from their recompute in every layer: the check the scores stand beside fails
    tr.comparisons.append(Comparison("weights", "recompute", np.full((tr.n_layers, tr.n_heads), 1e-3)))
    check = trace_check(tr)
    assert check.verified is False and check.value == pytest.approx(1e-3) and check.bound == 1e-5


def test_a_family_without_an_adapter_is_not_verified(tiny_lm: Callable[[str], attnscope.Model]) -> None:
    a = attribute(TEXT, model=tiny_lm("starcoder2"), methods="attention,leave_one_out")
    assert a.methods["attention"].check.verified is None and a.status == "NOT VERIFIED" and a.exit_code == 3
    assert a.methods["leave_one_out"].check.verified is True
