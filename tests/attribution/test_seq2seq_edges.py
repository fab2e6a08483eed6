"""Encoder-decoder edges found on the README's random-weight T5 demo ("The cat sat on the mat." -> "Die Katze
sass."): leave-one-out never takes away the decoder start token (its score is n/a with a reason, and the rank
agreement is over the other tokens), and input x gradient's finite-difference check holds on a ReLU model."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

import attnscope
from attnscope.attribution.api import attribute
from attnscope.attribution.gradients import FD_BOUND, gradients, scaling_check
from attnscope.attribution.leave_one_out import DECODER_START
from attnscope.attribution.objective import build_objective
from attnscope.attribution.record import Attribution, Cost, MethodCheck, MethodScores
from attnscope.attribution.render import markdown
from attnscope.tokens import Token

SOURCE, TARGET = "The cat sat on the mat.", "Die Katze sass."
TOL = 1e-5


def test_leave_one_out_keeps_the_decoder_start_token(tiny_lm: Callable[[str], attnscope.Model]) -> None:
    m = tiny_lm("t5")
    a = attribute(SOURCE, model=m, target=TARGET, methods="leave_one_out,leave_one_out_replaced,saliency")
    obj = build_objective(m, SOURCE, TARGET)
    start = obj.n_source  # 9: [PAD], T5's decoder start token
    assert a.tokens[start].text == "[PAD]" and a.tokens[start].special
    for name in ("leave_one_out", "leave_one_out_replaced"):
        ms = a.methods[name]
        assert ms.unscored == {start: DECODER_START} and ms.check.verified is True
        assert np.isnan(ms.scores[:, start]).all()  # reported as n/a, not a made-up number
        others = np.delete(ms.scores, start, axis=1)
        assert np.isfinite(others).all()  # target 0 was NaN at the start token before
        assert ms.cost.forwards == obj.n_tokens  # every token but the start one, plus the unperturbed row
        data = a.to_json()["methods"][name]
        assert data["unscored"] == {str(start): DECODER_START} and all(r[start] is None for r in data["scores"])
    # every target's rank agreement is defined, over the tokens but the start token (it was all NaN for target 0)
    assert a.ranked_tokens() == [i for i in range(obj.n_tokens) if i != start]
    for t in range(len(a.targets)):
        assert np.isfinite(a.rank_agreement(t)).all()
    text = markdown(a)
    assert "| n/a |" in text and f"token {start} ([PAD]) n/a: {DECODER_START}" in text
    assert "over the tokens but token 9 (n/a)" in text
    # a score beside it, against a direct forward: source token 2 (" cat") removed, target 0
    ids = torch.cat([obj.ids[:2], obj.ids[3:obj.n_source]])[None]
    with torch.no_grad():
        lp = m.model(input_ids=ids, decoder_input_ids=obj.ids[None, obj.n_source:]).logits[0, 0].log_softmax(-1)
    expected = float(obj.reference[0]) - float(lp[obj.target_ids[0]])
    assert abs(a.scores("leave_one_out")[0, 2] - expected) <= TOL * max(1.0, abs(expected))


def test_rank_agreement_leaves_out_unscored_tokens_only() -> None:
    check = MethodCheck(name="c", value=0.0, bound=1.0, verified=True, detail="d")
    cost = Cost(forwards=1, backwards=0, seconds=0.0)
    tokens = [Token(index=i, text=str(i), id=i) for i in range(4)]
    a_row = MethodScores(method="a", scores=np.array([[1.0, 2.0, 3.0, 4.0]]), unit="u", check=check, cost=cost)
    b_row = MethodScores(method="b", scores=np.array([[3.0, float("nan"), 2.0, 1.0]]), unit="u", check=check,
                         cost=cost, unscored={1: "why"})
    a = Attribution(model="m", architecture="x", kind="seq2seq", description="d", tokens=tokens, targets=["t"],
                    methods={"a": a_row, "b": b_row})
    rho = a.rank_agreement(0)  # over tokens 0, 2, 3: ranks (1, 2, 3) and (3, 2, 1)
    assert a.ranked_tokens() == [0, 2, 3] and abs(rho[0, 1] + 1.0) <= 1e-12
    stray = MethodScores(method="b", scores=b_row.scores, unit="u", check=check, cost=cost)  # a NaN not declared
    b = Attribution(model="m", architecture="x", kind="seq2seq", description="d", tokens=tokens, targets=["t"],
                    methods={"a": a_row, "b": stray})
    assert np.isnan(b.rank_agreement(0)[0, 1])  # an undeclared NaN is never ranked around


def test_input_x_gradient_check_holds_on_tiny_t5(tiny_lm: Callable[[str], attnscope.Model]) -> None:
    """At h = 0.01 the scaled inputs crossed 11 ReLU kinks and the check read 0.0751 > 0.02 (target 4, '##s')."""
    m = tiny_lm("t5")
    a = attribute(SOURCE, model=m, target=TARGET, methods="saliency,input_x_gradient")
    for ms in a.methods.values():
        assert ms.check.verified is True and ms.check.value <= 0.005, (ms.method, ms.check)
    obj = build_objective(m, SOURCE, TARGET)
    embeds, grads = gradients(obj)
    scores = (embeds[0] * grads).detach().double().sum(-1)  # input x gradient by hand: [target, token]
    assert np.abs(scores.numpy() - a.scores("input_x_gradient")).max() <= TOL
    assert scaling_check(obj, embeds, scores).value <= FD_BOUND
    assert scaling_check(obj, embeds, scores * 1.1).verified is False  # a 10% too large gradient
    assert scaling_check(obj, embeds, scores.flip(0)).verified is False  # rows given to the wrong targets
