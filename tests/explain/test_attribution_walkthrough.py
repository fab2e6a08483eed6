"""explain --attribution: each walkthrough ends on attribute()'s own score, every number printed is the computed
one, and every check it prints can fail (real MiniLM and SmolLM2)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import numpy as np
import pytest

import attnscope
from attnscope.attribution import attribute
from attnscope.attribution.alti import alti, block_error, transformed_vectors
from attnscope.attribution.blocks import capture_blocks
from attnscope.attribution.objective import build_objective
from attnscope.attribution.value_zeroing import value_zeroing
from attnscope.cli.core import ATTRIBUTION_WALKS
from attnscope.explain.attribution import (
    WALKED,
    AttributionWalkthrough,
    attribution_walkthrough,
    json_data,
    markdown,
    renderables,
)
from attnscope.explain.attribution_common import check
from attnscope.explain.attribution_steps import IG_SAME
from attnscope.explain.render import to_text
from tests.support.cli import run

TEXT = "time flies like an arrow"  # MiniLM: [CLS] time flies like an arrow [SEP]
FLIES = 2
PROMPT = "The capital of France is"  # SmolLM2: The capital of France is -> ' Paris'
FRANCE = 3


def arrays(w: AttributionWalkthrough, stage: str) -> dict[str, np.ndarray]:
    return next(s for s in w.steps if s.stage == stage).arrays


def text_of(w: AttributionWalkthrough) -> str:
    return to_text(renderables(w, width=200), width=200)


def number_after(text: str, before: str) -> float:
    """The number printed right after `before` (as the walkthrough prints it: 6 significant digits)."""
    match = re.search(re.escape(before) + r"\s*(-?[0-9.]+(?:e[-+]?[0-9]+)?)", text)
    assert match, f"{before!r} not in the output"
    return float(match.group(1))


def printed_score(text: str) -> float:
    return number_after(text, re.search(r"score of token \d+ \([^)]*\) for '[^']*':", text).group(0))  # type: ignore[union-attr]


def checks(w: AttributionWalkthrough) -> dict[str, dict[str, object]]:
    return {str(c["name"]).split(" (")[0]: c for c in w.checks}


@pytest.fixture(scope="module")
def ig(minilm: attnscope.Model) -> AttributionWalkthrough:
    return attribution_walkthrough(TEXT, "integrated_gradients", FLIES, model=minilm)


@pytest.fixture(scope="module")
def alti_walk(minilm: attnscope.Model) -> AttributionWalkthrough:
    return attribution_walkthrough(TEXT, "alti", FLIES, model=minilm)


def test_walked_methods_are_the_ones_the_cli_names() -> None:
    assert WALKED == ATTRIBUTION_WALKS


def test_integrated_gradients_ends_on_captums_score(ig: AttributionWalkthrough, minilm: attnscope.Model) -> None:
    own = attribute(TEXT, model=minilm, methods="integrated_gradients").methods["integrated_gradients"]
    assert abs(ig.final - own.scores[0, FLIES]) <= IG_SAME * max(1.0, float(np.abs(own.scores).max()))
    terms = arrays(ig, "riemann")["terms"]  # [alpha, (alpha, w_k, (x_I - x'_I).g_I, w_k x that)]
    steps = own.settings["steps"][0]
    assert terms.shape == (steps, 4) and np.allclose(terms[:, 0], np.linspace(0, 1, steps), atol=1e-7)
    assert terms[:, 3].sum() == pytest.approx(ig.final, abs=1e-12)  # the printed terms add up to the score
    assert terms[:, 1].sum() == pytest.approx(1.0, abs=1e-12)  # the trapezoid rule's weights, as printed
    assert terms[0, 1] == pytest.approx(0.5 / (steps - 1), abs=1e-15)
    here, captum = arrays(ig, "completeness")["scores"].T  # [token] each
    assert np.abs(here - own.scores[0]).max() <= IG_SAME and np.abs(captum - own.scores[0]).max() <= 1e-7
    assert ig.status == "PASS" and ig.exit_code == 0


def test_integrated_gradients_completeness_is_the_methods_check(ig: AttributionWalkthrough) -> None:
    total, f_x, f_base, delta, gap, rel = arrays(ig, "completeness")["sum"][0]
    assert total == pytest.approx(arrays(ig, "completeness")["scores"][:, 0].sum(), abs=1e-12)
    assert delta == pytest.approx(f_x - f_base, abs=1e-12) and gap == pytest.approx(total - delta, abs=1e-12)
    mine, theirs = checks(ig)["completeness"], checks(ig)["integrated_gradients: completeness"]
    assert mine["value"] == pytest.approx(rel, abs=1e-12)
    assert abs(float(mine["value"]) - float(theirs["value"])) <= 1e-5  # Captum's float32 sum against ours
    path = arrays(ig, "path")["path"]  # rows: the points nearest alpha 0, 0.25, ..., 1; columns alpha, f, d0..
    assert path[0, 1] == pytest.approx(f_base, abs=1e-6) and path[-1, 1] == pytest.approx(f_x, abs=1e-6)


def test_integrated_gradients_prints_its_numbers(ig: AttributionWalkthrough) -> None:
    out = text_of(ig)
    assert printed_score(out) == pytest.approx(ig.final, rel=1e-5)
    assert number_after(out, "Sum here:") == pytest.approx(ig.final, rel=1e-5)
    total, _, _, delta, _, rel = arrays(ig, "completeness")["sum"][0]
    assert number_after(out, "Sum") == pytest.approx(total, rel=1e-5)
    assert number_after(out, "against") == pytest.approx(delta, rel=1e-5)
    assert f"{rel:.2%} of |f(x) - f(x')|" in out
    assert "within the 1% the method requires" in out and "PASS: 4 checks" in out
    n = arrays(ig, "riemann")["terms"].shape[0]  # Captum's step sizes as they come sum to 1 - 1/n
    said = next(s for s in ig.steps if s.stage == "completeness").text
    assert number_after(said, "the sum would be") == pytest.approx(total * (n - 1) / n, rel=1e-5)
    grads = arrays(ig, "gradients")["gradient"]  # [shown alphas, (alpha, |g_I|, (x_I-x'_I).g_I, d0..)]
    block = out[out.index("(gradients)"):].splitlines()
    row = next(line for line in block if line.startswith("k=0 ") and "│" in line)
    assert [float(c) for c in row.split("│")[1:4]] == pytest.approx(list(np.round(grads[0, :3], 4)), abs=1e-4)


def test_a_wrong_riemann_rule_fails_the_captum_check(ig: AttributionWalkthrough) -> None:
    terms = arrays(ig, "riemann")["terms"]
    n = terms.shape[0]
    unscaled = (terms[:, 1] * (n - 1) / n * terms[:, 2]).sum()  # Captum's step sizes as they come: sum 1 - 1/n
    assert not check("wrong rule", abs(unscaled - ig.final), IG_SAME, "")["ok"]


def test_alti_layer_and_rollout_are_altis_own(alti_walk: AttributionWalkthrough, minilm: attnscope.Model) -> None:
    mixing = alti(minilm, build_objective(minilm, TEXT).inputs())
    layer = alti_walk.layer
    assert layer == 5  # the last by default
    c = arrays(alti_walk, "contributions")["c_ij"]  # [key, (d, |y|-d, clipped, c_ij, alti())]; encoder: row I
    assert np.abs(c[:, 3] - mixing.matrices[layer, FLIES]).max() <= 1e-5  # alti() takes float32 distances
    assert np.array_equal(c[:, 4], mixing.matrices[layer, FLIES])
    assert np.array_equal(c[:, 2], np.maximum(c[:, 1], 0.0))  # the clip, as printed
    assert alti_walk.final == pytest.approx(float(mixing.rolled()[:, FLIES].mean()), abs=1e-12)
    own = attribute(TEXT, model=minilm, methods="alti").scores("alti")[0, FLIES]
    assert alti_walk.final == pytest.approx(own, abs=1e-12)
    sums = arrays(alti_walk, "transformed")["sum"]  # [(bias, sum_j T + bias, captured y_i, difference), (|.|_1, d0..)]
    assert np.abs(sums[3, 1:]).max() <= 1e-5 and checks(alti_walk)["sum of T_i(x_j) = block output"]["ok"]


def test_alti_prints_its_numbers(alti_walk: AttributionWalkthrough, minilm: attnscope.Model) -> None:
    out = text_of(alti_walk)
    c = arrays(alti_walk, "contributions")["c_ij"]
    assert number_after(out, "for token I: d =") == pytest.approx(c[FLIES, 0], rel=1e-5)
    assert number_after(out, "(alti()'s:") == pytest.approx(c[FLIES, 4], rel=1e-5)
    assert printed_score(out) == pytest.approx(alti_walk.final, rel=1e-5)
    line = next(x for x in out.splitlines() if x.startswith("2:flies") and x.count("│") == 5)
    assert [float(v) for v in line.split("│")[1:]] == pytest.approx(list(np.round(c[FLIES], 4)), abs=1e-4)


def test_alti_other_layer(minilm: attnscope.Model) -> None:
    w = attribution_walkthrough(TEXT, "alti", 4, model=minilm, layer=1)
    mixing = alti(minilm, build_objective(minilm, TEXT).inputs())
    assert w.layer == 1 and np.array_equal(arrays(w, "contributions")["c_ij"][:, 4], mixing.matrices[1, 4])
    wrong = check("wrong", float(np.abs(arrays(w, "contributions")["c_ij"][:, 3] - mixing.matrices[2, 4]).max()),
                  1e-9, "")  # another layer's row is not this one: the check can fail
    assert not wrong["ok"]


def test_the_block_check_fails_on_another_layers_vectors(minilm: attnscope.Model) -> None:
    blocks = capture_blocks(minilm, build_objective(minilm, TEXT).inputs(), whole_block=True)
    t, bias = transformed_vectors(blocks[4])
    assert block_error(blocks[4], t, bias) <= 1e-5 < block_error(blocks[5], t, bias)


def test_value_zeroing_row_and_score_are_its_own(minilm: attnscope.Model) -> None:
    w = attribution_walkthrough(TEXT, "value_zeroing", FLIES, model=minilm, layer=3)
    mixing = value_zeroing(minilm, build_objective(minilm, TEXT).inputs())
    row = arrays(w, "normalised")["row"]  # [key, (1 - cos, normalised, value_zeroing())]
    assert np.abs(row[:, 1] - mixing.matrices[3, FLIES]).max() <= 1e-12
    assert row[:, 1].sum() == pytest.approx(1.0, abs=1e-12)
    changed = arrays(w, "changed")["distance"][:, 0]  # each position's distance with token I zeroed
    assert changed[FLIES] == pytest.approx(row[FLIES, 0], abs=1e-12)
    alpha = arrays(w, "zeroed")["v_I"][:, 0]  # [head]: alpha^h_iI
    tr = attnscope.trace(TEXT, model=minilm)
    assert np.abs(alpha - tr.weights[3, :, FLIES, FLIES]).max() <= attnscope.TOLERANCE
    assert w.final == pytest.approx(attribute(TEXT, model=minilm, methods="value_zeroing")
                                    .scores("value_zeroing")[0, FLIES], abs=1e-12)
    assert w.status == "PASS"


def test_rollout_and_attention_end_on_attributes_score(minilm: attnscope.Model) -> None:
    both = attribute(TEXT, model=minilm, methods="rollout,attention")
    for method in ("rollout", "attention"):
        w = attribution_walkthrough(TEXT, method, FLIES, model=minilm)
        assert w.final == pytest.approx(both.scores(method)[0, FLIES], abs=1e-6), method
        assert printed_score(text_of(w)) == pytest.approx(w.final, rel=1e-5)


def test_cli_json_and_markdown(capsys: pytest.CaptureFixture[str], minilm: attnscope.Model) -> None:
    code, out, _ = run(capsys, "explain", TEXT, "--attribution", "leave_one_out", "--token", "2", "--format", "json")
    data = json.loads(out)
    own = attribute(TEXT, model=minilm, methods="leave_one_out").scores("leave_one_out")[0, FLIES]
    assert code == 0 and data["method"] == "leave_one_out" and data["token"] == 2 and data["status"] == "PASS"
    assert data["score"] == pytest.approx(own, abs=1e-5) and data["attribute_score"] == pytest.approx(own, abs=1e-5)
    f = data["steps"][-1]["arrays"]["f"][0]  # f(x), f(x without I), score
    assert f[0] - f[1] == pytest.approx(data["score"], abs=1e-12)
    code, out, _ = run(capsys, "explain", TEXT, "--attribution", "rollout", "--token", "2", "--format", "markdown")
    assert code == 0 and out.startswith("# all-MiniLM-L6-v2: rollout for input token 2 (flies)")
    assert "**PASS: 2 checks**" in out


@pytest.mark.parametrize(("args", "message"), [
    (["--attribution", "nope", "--token", "1"], "unknown method 'nope': choose --attribution integrated_gradients"),
    (["--attribution", "flow", "--token", "1"], "'flow' has no walkthrough: choose --attribution "
                                                "integrated_gradients, alti, "),
    (["--attribution", "alti"], "explain --attribution needs --token I"),
    (["--attribution", "alti", "--token", "9"], "token 9 is out of range: the input ([CLS] time flies [SEP]) has 4"),
    (["--attribution", "alti", "--token", "1", "--layer", "6"], "layer 6 is out of range"),
    (["--attribution", "alti", "--token", "1", "--head", "2"], "--head is not read by explain --attribution"),
    (["--attribution", "saliency", "--token", "1"], "saliency does not apply to all-MiniLM-L6-v2"),
])
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], minilm: attnscope.Model,
                                          args: list[str], message: str) -> None:
    code, out, err = run(capsys, "explain", "time flies", *args)
    assert code == 2 and out == "" and message in err and len(err.strip().splitlines()) == 1, err


def test_cli_integrated_gradients_short_of_steps_exits_1(capsys: pytest.CaptureFixture[str],
                                                         minilm: attnscope.Model) -> None:
    code, out, _ = run(capsys, "explain", TEXT, "--attribution", "integrated_gradients", "--token", "2",
                       "--ig-steps", "4", "--ig-max-steps", "4", "--format", "json")
    data = json.loads(out)
    verdicts = {c["name"]: c["ok"] for c in data["checks"]}
    assert code == 1 and data["status"] == "FAIL" and verdicts["completeness"] is False  # 28% at 4 steps
    assert verdicts["Riemann sum = Captum's"] is True and verdicts["equals attribute()"] is True
    code, _, err = run(capsys, "explain", TEXT, "--ig-steps", "4")
    assert code == 2 and "--ig-steps is for explain --attribution integrated_gradients" in err


def test_encoder_decoder_follows_the_first_target_token(seq2seq: Callable[[str], attnscope.Model]) -> None:
    t5 = seq2seq("t5")
    own = attribute("time flies", model=t5, target="le temps", methods="leave_one_out,integrated_gradients")
    for method in ("leave_one_out", "integrated_gradients"):
        w = attribution_walkthrough("time flies", method, 1, model=t5, target="le temps")
        assert w.final == pytest.approx(own.scores(method)[0, 1], abs=1e-5) and w.status == "PASS", method
        assert "follows the first target token" in w.steps[0].text
    with pytest.raises(attnscope.AttnscopeError, match="alti does not apply to T5ForConditionalGeneration"):
        attribution_walkthrough("time flies", "alti", 1, model=t5, target="le temps")
    (start,) = own.methods["leave_one_out"].unscored  # the decoder's start token: never taken away, no score
    assert own.tokens[start].text == t5.tokenizer.pad_token  # T5's decoder starts from its pad token
    with pytest.raises(attnscope.AttnscopeError, match=f"token {start} .* has no leave_one_out score"):
        attribution_walkthrough("time flies", "leave_one_out", start, model=t5, target="le temps")


def test_smollm2_alti_is_altis_own(smollm2: attnscope.Model) -> None:
    w = attribution_walkthrough(PROMPT, "alti", FRANCE, model=smollm2, target=" Paris")
    mixing = alti(smollm2, build_objective(smollm2, PROMPT, " Paris").inputs())
    c = arrays(w, "contributions")["c_ij"]  # row 4 (' is', predicting ' Paris') of the last layer
    assert w.layer == 29 and np.abs(c[:, 3] - mixing.matrices[29, 4]).max() <= 1e-5  # alti(): float32 distances
    terms = arrays(w, "score")["terms"]  # [key, (M_last[4, k], R_below[k, I], product)]
    assert terms[:, 2].sum() == pytest.approx(float(mixing.rolled()[4, FRANCE]), abs=1e-12)
    assert w.final == pytest.approx(float(mixing.rolled()[4, FRANCE]), abs=1e-12) and w.status == "PASS"
    assert "pre-norm" in next(s for s in w.steps if s.stage == "block").text


def test_smollm2_gradients_end_on_attributes_score(smollm2: attnscope.Model) -> None:
    own = attribute(PROMPT, model=smollm2, target=" Paris", methods="saliency,input_x_gradient")
    for method in ("saliency", "input_x_gradient"):
        w = attribution_walkthrough(PROMPT, method, FRANCE, model=smollm2, target=" Paris")
        assert w.final == pytest.approx(own.scores(method)[0, FRANCE], rel=1e-6), method
        g = arrays(w, "gradient")["gradient"]  # [token, (|g|, x.g, d0..)]
        assert w.final == pytest.approx(g[FRANCE, 0 if method == "saliency" else 1], abs=0)


def test_smollm2_integrated_gradients_short_of_steps_fails_completeness(smollm2: attnscope.Model) -> None:
    # 32 steps are too few on SmolLM2's rough path (512 pass): the walkthrough's completeness fails as the method's
    w = attribution_walkthrough(PROMPT, "integrated_gradients", FRANCE, model=smollm2, target=" Paris",
                                ig_steps=32, ig_max_steps=32)
    mine, theirs = checks(w)["completeness"], checks(w)["integrated_gradients: completeness"]
    assert mine["ok"] is False and theirs["ok"] is False and w.status == "FAIL" and w.exit_code == 1
    assert abs(float(mine["value"]) - float(theirs["value"])) <= 1e-4
    assert checks(w)["Riemann sum = Captum's"]["ok"] and checks(w)["equals attribute()"]["ok"]
    assert "NOT within the 1% the method requires" in text_of(w)
    assert markdown(w).startswith("# smollm2: integrated_gradients for input token 3")
    assert json_data(w)["status"] == "FAIL"
