"""Head gates inside the real forward pass: open gates change nothing bit for bit, a closed gate equals
an independent computation, and the effects read the model's own outputs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import attnscope
from attnscope import families, maths
from attnscope.errors import AttnscopeError
from attnscope.interventions import ablate
from attnscope.interventions.ablate import setting_gates
from attnscope.interventions.effects import outputs, prepare
from attnscope.interventions.gates import HeadEdit, contexts, edited_capture, mean_contexts, ones, run
from attnscope.tokens import encode
from attnscope.verify.recompute import layer_params
from tests.support.interventions import EVERY_ENCODER_DECODER, EVERY_FAMILY

FAMILIES = EVERY_FAMILY
# gated by kind (encoder, decoder, cross) in tests/interventions/test_seq2seq.py
GATED_BY_KIND = EVERY_ENCODER_DECODER
TEXTS = ["the cat sat on the mat", "dogs bark"]
TOL = 1e-5


@pytest.mark.parametrize("family", list(GATED_BY_KIND))
def test_encoder_decoder_models_are_refused_by_patch_knockout_importance(minilm: attnscope.Model, tmp_path: Path,
                                                        family: str) -> None:
    from attnscope.interventions.importance_report import importance
    from attnscope.interventions.knockout import knockout
    from attnscope.interventions.patch import patch
    from tests.support.seq2seq import tiny_seq2seq

    m = tiny_seq2seq(family, minilm)
    for call in (lambda: patch("the cat", "a dog", model=m), lambda: knockout("the cat sat", [2], [1], model=m),
                 lambda: importance(m, ["the cat sat"], tmp_path / "out", {"kind": "test"})):
        with pytest.raises(AttnscopeError, match=f"ablate works on encoder-decoder models like .*{family}.*, "
                           "patch, knockout and importance not yet") as err:
            call()
        assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


def _batch(m: attnscope.Model) -> dict[str, torch.Tensor]:
    return encode(m.tokenizer, TEXTS).inputs


def test_the_gate_tests_cover_every_family_check_supports() -> None:
    assert set(FAMILIES) | set(GATED_BY_KIND) == set(families.FAMILIES)  # a new family needs its gate test


@pytest.mark.parametrize("family", FAMILIES)
def test_open_gates_change_nothing_bit_for_bit(any_family: Callable[[str], attnscope.Model], family: str) -> None:
    m = any_family(family)
    inputs = _batch(m)
    with torch.no_grad():
        plain = m.model(**inputs, output_hidden_states=True)
        gated = run(m, inputs, HeadEdit(m.n_layers, ones(m, 2)), output_hidden_states=True)
        # the replacing path too: open gates let in nothing of the (mean) source
        mean = run(m, inputs, HeadEdit(m.n_layers, ones(m, 2), mean_contexts(m, inputs)), output_hidden_states=True)
        closed = run(m, inputs, HeadEdit(m.n_layers, torch.zeros_like(ones(m, 2))))
    for out in (gated, mean):
        assert all(torch.equal(a, b) for a, b in zip(plain.hidden_states, out.hidden_states, strict=True))
    assert not torch.equal(plain.last_hidden_state, closed.last_hidden_state)  # the gates do act


@pytest.mark.parametrize("family", ("bert", "distilbert", "albert", "gpt2", "llama", "gemma2", "gpt_oss"))
def test_zeroed_head_equals_projection_of_the_other_heads(any_family: Callable[[str], attnscope.Model],
                                                          family: str) -> None:
    """Also on the modern families: grouped k/v heads and RoPE (llama), soft-capping and a sliding layer
    (gemma2), attention sinks (gpt_oss)."""
    m = any_family(family)
    inputs = encode(m.tokenizer, TEXTS[:1]).inputs
    layer, head = m.n_layers - 1, 2
    scale = setting_gates(m, [[(layer, head)]], each=False)  # row 0 open, row 1 without (layer, head)
    rows = {k: v.expand(2, -1) for k, v in inputs.items()}
    with torch.no_grad(), edited_capture(m, HeadEdit(m.n_layers, scale)) as cap:
        m.model(**rows)
    # row 0's context is row 1's before the gate (the layers below are the same); the capture sees it gated
    assert_zeroed_head_is_the_others_projected(cap.calls[layer].context, cap.output[layer],
                                               layer_params(m.model)[layer], head)  # type: ignore[index]


def assert_zeroed_head_is_the_others_projected(context: torch.Tensor, output: torch.Tensor,
                                               p: maths.AttentionParams, head: int) -> None:
    """Two rows through one attention layer, row 1 with `head` gated to 0: its output is the output projection
    of row 0's context with that head zeroed (the rows' inputs are the same). context: [2, head, query, d_head]
    as captured; output: [2, query, d_model]."""
    zeroed = context[0:1].clone()  # [1, head, query, d_head]
    assert bool((context[1, head] == 0).all())
    zeroed[:, head] = 0.0
    expected = maths.project(maths.merge_heads(zeroed), p.w_o, p.b_o)  # [1, query, d_model]
    assert (output[1:2] - expected).abs().max() <= TOL
    assert (output[0:1] - expected).abs().max() > 1e-4  # row 0 kept the head


@pytest.mark.parametrize("family", ("gpt2", "llama"))
def test_causal_effects_read_the_models_own_logits(lm_heads: Callable[[str], attnscope.Model], family: str) -> None:
    m = lm_heads(family)
    probe = prepare(m, "the cat sat", target="on the mat")
    with torch.no_grad():
        measured = outputs(probe, probe.inputs, None)
        logprobs = m.model(**probe.inputs).logits.log_softmax(-1)[0]  # [token, vocab]
    ids = probe.inputs["input_ids"][0]
    target = sum(logprobs[p, t] for p, t in zip(probe.positions, probe.target_ids, strict=True))
    loss = -logprobs[:-1].gather(-1, ids[1:, None]).mean()
    assert probe.tokens[probe.positions[0] + 1].id == probe.target_ids[0]
    assert abs(float(measured["target_logprob"][0]) - float(target)) <= TOL
    assert abs(float(measured["loss"][0]) - float(loss)) <= TOL


def test_ablation_rows_match_separate_runs(lm_heads: Callable[[str], attnscope.Model]) -> None:
    m = lm_heads("gpt2")
    result = ablate("the cat sat on the", heads=[(1, 3)], model=m, each=True)
    assert result.grid is not None and result.ablated is not None
    alone = ablate("the cat sat on the", heads=[(0, 2)], model=m)
    assert alone.ablated is not None
    assert abs(result.grid["d_target_logprob"][0, 2] - alone.ablated["d_target_logprob"]) <= TOL
    assert result.target == alone.target and result.grid["d_target_logprob"].shape == (2, 4)


def test_masked_lm_reads_the_mask(lm_heads: Callable[[str], attnscope.Model]) -> None:
    m = lm_heads("bert")
    result = ablate("the cat [MASK] on the mat", heads=[(0, 0)], model=m)
    assert result.kind == "masked-lm" and result.ablated is not None
    with pytest.raises(AttnscopeError, match="no mask token"):
        ablate("the cat sat", heads=[(0, 0)], model=m)


def test_bad_input_is_one_line(tiny_model: Callable[[str], attnscope.Model],
                               lm_heads: Callable[[str], attnscope.Model]) -> None:
    m = tiny_model("bert")
    for heads, what in (([(2, 0)], "layer 2 is out of range"), ([(0, 4)], "head 4 is out of range")):
        with pytest.raises(AttnscopeError, match=what):
            ablate("a text", heads=heads, model=m)
    with pytest.raises(AttnscopeError, match="tokenizes to nothing"):
        ablate("a text", heads=[(0, 0)], model=lm_heads("gpt2"), target="   ")
    with pytest.raises(AttnscopeError, match="encoder"):
        ablate("a text", heads=[(0, 0)], model=m, target="x")


def test_real_smollm2_open_gates_and_the_capital(smollm2: attnscope.Model) -> None:
    """On the real SmolLM2-135M: open gates change nothing bit for bit, the greedy target is " Paris", and
    removing head 23.4 lowers its log-probability as much as the head removed in a run of its own."""
    inputs = encode(smollm2.tokenizer, ["The capital of France is"]).inputs
    with torch.no_grad():
        plain = smollm2.model(**inputs).logits
        gated = run(smollm2, inputs, HeadEdit(smollm2.n_layers, ones(smollm2, 1))).logits
    assert torch.equal(plain, gated)
    result = ablate("The capital of France is", [(23, 4)], model=smollm2)
    assert result.target == " Paris" and result.ablated is not None
    paris = smollm2.tokenizer(" Paris", add_special_tokens=False)["input_ids"]
    closed = ones(smollm2, 1)
    closed[23, 0, 4] = 0.0
    with torch.no_grad():
        alone = run(smollm2, inputs, HeadEdit(smollm2.n_layers, closed)).logits
    change = alone[0, -1].log_softmax(-1)[paris[0]] - plain[0, -1].log_softmax(-1)[paris[0]]
    assert abs(result.ablated["d_target_logprob"] - float(change)) <= 1e-4
    assert result.ablated["d_target_logprob"] < 0  # the head carries part of the answer


def test_mean_ablation_lets_in_the_reference_mean(tiny_model: Callable[[str], attnscope.Model]) -> None:
    m = tiny_model("gpt2")
    reference = encode(m.tokenizer, TEXTS).inputs
    means = mean_contexts(m, reference)  # [1, head, 1, d_head] per layer
    ctx = contexts(m, reference)[0]  # [batch, head, query, d_head]
    keep = reference["attention_mask"].bool()
    assert torch.allclose(means[0][0, :, 0], ctx.permute(0, 2, 1, 3)[keep].mean(0), atol=TOL)  # type: ignore[index]
    inputs = encode(m.tokenizer, ["a different text here"]).inputs
    closed = ones(m, 1)
    closed[0, 0, 1] = 0.0
    with torch.no_grad(), edited_capture(m, HeadEdit(m.n_layers, closed, means)) as cap:
        m.model(**inputs)
    got = cap.calls[0].context[0, 1]  # [query, d_head]: every position holds the mean
    assert torch.equal(got, means[0][0, 1, 0].expand_as(got))  # type: ignore[index]
    result = ablate("a different text here", [(0, 1)], model=m, mode="mean", reference=TEXTS)
    assert result.mode == "mean" and result.ablated is not None and result.ablated["mean_token_change"] > 0
