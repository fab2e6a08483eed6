"""Attention-based attribution on encoder-decoders (attribution.seq2seq_attention), on random-weight T5 and BART:
raw attention (cross | decoder self), rollout through the encoder and the decoder, attention x gradient."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import attnscope
from attnscope.attribution import attribute
from attnscope.attribution.api import make_settings
from attnscope.attribution.methods import Context
from attnscope.attribution.objective import build_objective
from attnscope.attribution.seq2seq_attention import seq2seq_rollout, trace_check, trace_of
from attnscope.errors import AttnscopeError
from attnscope.explain.attribution import attribution_walkthrough

SOURCE, TARGET = "The house is wonderful.", "Das Haus ist"
FAMILIES = ["t5", "bart"]


def joint_rollout(encoder: np.ndarray, decoder: np.ndarray, cross: np.ndarray) -> np.ndarray:
    """An independent rollout over the joint graph of source + target tokens: one [n + m, n + m] matrix per
    sub-layer (the other side's rows the identity), multiplied in order; the decoder's rows."""
    n, m = encoder.shape[-1], decoder.shape[-1]
    r = np.eye(n + m)
    for a in encoder.mean(axis=1):
        step = np.eye(n + m)
        step[:n, :n] = 0.5 * a + 0.5 * np.eye(n)
        r = step @ r
    for a_self, a_cross in zip(decoder.mean(axis=1), cross.mean(axis=1), strict=True):
        step = np.eye(n + m)
        step[n:, n:] = 0.5 * a_self + 0.5 * np.eye(m)
        r = step @ r
        step = np.eye(n + m)
        step[n:, :n], step[n:, n:] = 0.5 * a_cross, 0.5 * np.eye(m)
        r = step @ r
    out: np.ndarray = r[n:]
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_is_the_cross_row_beside_the_decoder_row(family: str,
                                                           tiny_lm: Callable[[str], attnscope.Model]) -> None:
    m = tiny_lm(family)
    a = attribute(SOURCE, model=m, target=TARGET, methods="attention,rollout,attention_x_gradient")
    obj = build_objective(m, SOURCE, TARGET)
    tr = trace_of(obj)
    assert [t.id for t in tr.encoder.tokens] + [t.id for t in tr.decoder.tokens] == obj.ids.tolist()
    n, last = obj.n_source, tr.decoder.n_layers - 1
    scores = a.scores("attention")  # [target, source + decoder token]
    assert scores.shape == (obj.n_targets, obj.n_tokens) == (4, len(a.tokens))
    assert np.abs(scores[:, :n] - tr.cross.weights[last].mean(axis=0)).max() <= 1e-6
    assert np.abs(scores[:, n:] - tr.decoder.weights[last].mean(axis=0)).max() <= 1e-6
    assert np.allclose(scores[:, :n].sum(-1), 1, atol=1e-5) and np.allclose(scores[:, n:].sum(-1), 1, atol=1e-5)
    assert (np.triu(scores[:, n:], k=1) == 0).all()  # the decoder sees no later target token
    for ms in a.methods.values():
        assert ms.check.verified is True and "encoder PASS, decoder PASS, cross PASS" in ms.check.detail
    wrong = np.concatenate([tr.decoder.weights[last].mean(axis=0), tr.cross.weights[last].mean(axis=0)], -1)
    assert wrong.shape != scores.shape or np.abs(wrong - scores).max() > 1e-3  # the sides swapped differ


@pytest.mark.parametrize("family", FAMILIES)
def test_rollout_equals_the_joint_graph_product(family: str, tiny_lm: Callable[[str], attnscope.Model]) -> None:
    m = tiny_lm(family)
    a = attribute(SOURCE, model=m, target=TARGET, methods="rollout")
    tr = trace_of(build_objective(m, SOURCE, TARGET))
    enc, dec, cross = (k.weights.astype(np.float64) for k in (tr.encoder, tr.decoder, tr.cross))
    joint = joint_rollout(enc, dec, cross)
    assert np.abs(a.scores("rollout") - joint).max() <= 1e-12
    assert np.allclose(a.scores("rollout").sum(-1), 1, atol=1e-5) and (a.scores("rollout") >= 0).all()
    no_encoder = joint_rollout(enc[:0], dec, cross)  # cross-attention not reading the encoder's rolled output
    assert np.abs(a.scores("rollout") - no_encoder).max() > 1e-3
    first = attribute(SOURCE, model=m, target=TARGET, methods="rollout", layer=0).scores("rollout")
    assert np.abs(first - joint_rollout(enc, dec[:1], cross[:1])).max() <= 1e-12
    assert np.abs(seq2seq_rollout(enc, dec, cross, 0) - first).max() <= 1e-12


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_x_gradient_reads_its_own_forward(family: str, tiny_lm: Callable[[str], attnscope.Model]) -> None:
    """Its weights are the trace's (the check), and the layer asked for is the one used."""
    m = tiny_lm(family)
    last = attribute(SOURCE, model=m, target=TARGET, methods="attention_x_gradient")
    first = attribute(SOURCE, model=m, target=TARGET, methods="attention_x_gradient", layer=0)
    ms = last.methods["attention_x_gradient"]
    assert ms.check.verified is True and ms.cost.backwards == 4 and ms.settings["layer"] == 1
    assert ms.scores.shape == (4, len(last.tokens)) and np.isfinite(ms.scores).all()
    assert np.abs(ms.scores - first.scores("attention_x_gradient")).max() > 1e-9


def test_a_wrong_trace_fails_the_check(tiny_lm: Callable[[str], attnscope.Model]) -> None:
    tr = trace_of(build_objective(tiny_lm("t5"), SOURCE, TARGET))
    assert trace_check(tr).verified is True
    tr.cross.comparisons[0].errors[0] = 1e-3  # one cross-attention stage off by more than the bound
    check = trace_check(tr)
    assert check.verified is False and "cross FAIL" in check.detail and check.value == 1e-3


def test_the_one_stack_walkthroughs_refuse_an_encoder_decoder(tiny_lm: Callable[[str], attnscope.Model]) -> None:
    for method in ("attention", "rollout"):
        with pytest.raises(AttnscopeError, match="joins the encoder, the decoder and cross-attention") as exc:
            attribution_walkthrough(SOURCE, method, 1, model=tiny_lm("t5"), target=TARGET)
        assert "\n" not in str(exc.value) and exc.value.parameter == "attribution"


def test_the_trace_is_made_once_per_run(tiny_lm: Callable[[str], attnscope.Model]) -> None:
    obj = build_objective(tiny_lm("bart"), SOURCE, TARGET)
    ctx = Context(obj, make_settings())
    from attnscope.attribution.seq2seq_attention import shared_trace

    assert shared_trace(ctx) is shared_trace(ctx)
