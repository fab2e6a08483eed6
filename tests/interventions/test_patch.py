"""Activation patching and attention knockout: a run patched with its own activations is unchanged bit for
bit, a knocked-out edge equals a recompute with that mask entry at -inf, and bad input is one line."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import attnscope
from attnscope import families, maths
from attnscope.errors import AttnscopeError
from attnscope.interventions.gates import HeadEdit, contexts, edited_capture, run
from attnscope.interventions.knockout import knockout
from attnscope.interventions.patch import patch, patch_rows
from attnscope.tokens import encode
from tests.support.interventions import EVERY_FAMILY

TOL = 1e-5


@pytest.mark.parametrize("family", EVERY_FAMILY)
def test_patching_a_run_with_its_own_activations_changes_nothing(
        any_family: Callable[[str], attnscope.Model], family: str) -> None:
    m = any_family(family)
    inputs = encode(m.tokenizer, ["the cat sat on the mat", "dogs bark at night"]).inputs
    own: list[torch.Tensor | None] = list(contexts(m, inputs))  # [batch, head, query, d_head] per layer
    every_head_closed = torch.zeros(m.n_layers, 2, m.n_heads)
    with torch.no_grad():
        plain = m.model(**inputs, output_hidden_states=True)
        patched = run(m, inputs, HeadEdit(m.n_layers, every_head_closed, own), output_hidden_states=True)
        other = run(m, inputs, HeadEdit(m.n_layers, every_head_closed, [c.flip(0) for c in own]))  # type: ignore[union-attr]
    assert all(torch.equal(a, b) for a, b in zip(plain.hidden_states, patched.hidden_states, strict=True))
    assert not torch.equal(plain.last_hidden_state, other.last_hidden_state)  # the source does flow in


def test_patch_grid_matches_one_patch_run_alone(lm_heads: Callable[[str], attnscope.Model]) -> None:
    m = lm_heads("gpt2")
    result = patch("the cat sat on the", "the dog ran on the", model=m, target="mat", contrast="dog")
    assert result.denoised.shape == (2, 4) and result.noised.shape == (2, 4)
    both = encode(m.tokenizer, ["the cat sat on the", "the dog ran on the"]).inputs
    rows, edit = patch_rows(m, both)
    layer, head, n = 1, 3, 2 * 4
    row = 2 + layer * 4 + head  # the corrupt input with the clean (1, 3) context
    one = HeadEdit(m.n_layers, edit.scale[:, row : row + 1], [s[row : row + 1] for s in edit.source])  # type: ignore[index,union-attr]
    with torch.no_grad():
        logits = m.model(**{k: v[row : row + 1] for k, v in rows.items()}, **{}).logits  # type: ignore[operator]
        gated = run(m, {k: v[row : row + 1] for k, v in rows.items()}, one).logits  # type: ignore[attr-defined]
    ids = m.tokenizer.convert_tokens_to_ids([result.answer.strip(), result.contrast.strip()])  # type: ignore[union-attr]
    last = int(both["input_ids"].shape[1]) - 1
    diff = float(gated[0, last, ids[0]] - gated[0, last, ids[1]])
    assert abs((diff - result.corrupt) / (result.clean - result.corrupt) - result.denoised[layer, head]) <= 1e-4
    assert not torch.equal(logits, gated)
    assert n == m.n_layers * m.n_heads


def test_patch_refuses_different_lengths(tiny_model: Callable[[str], attnscope.Model]) -> None:
    m = tiny_model("bert")
    a, b = (len(m.tokenizer(t)["input_ids"]) for t in ("the cat", "the big dog barks"))
    assert a != b
    with pytest.raises(AttnscopeError, match=f"clean text is {a} tokens and the corrupt text {b} tokens"):
        patch("the cat", "the big dog barks", model=m)


@pytest.mark.parametrize("family", ("bert", "gpt2", "llama", "qwen3", "gpt_neox", "olmo2", "modernbert"))
def test_knockout_equals_recompute_with_minus_infinity(any_family: Callable[[str], attnscope.Model],
                                                       family: str) -> None:
    """The families whose last layer has no window, soft-cap or sink: the recompute is q k^T, scale, mask."""
    m = any_family(family)
    inputs = encode(m.tokenizer, ["the cat sat on the mat"]).inputs
    n, i, j, layer = int(inputs["input_ids"].shape[1]), 1, 4, m.n_layers - 1
    knock: list[torch.Tensor | None] = [None] * m.n_layers
    knock[layer] = torch.zeros(1, 1, n, n)
    knock[layer][0, 0, j, i] = float("-inf")  # type: ignore[index]
    with torch.no_grad(), edited_capture(m, HeadEdit(m.n_layers, knock=knock)) as cap:
        m.model(**inputs)
    call = cap.calls[layer]
    k = call.k.repeat_interleave(call.q.shape[1] // call.k.shape[1], dim=1)  # grouped keys per query head
    mask = maths.causal_mask(n) if families.is_causal(m.model) else torch.zeros(n, n)  # [query, key]
    mask = mask.clone()
    mask[j, i] = float("-inf")
    expected = maths.softmax(maths.apply_mask(maths.scale(maths.dot_scores(call.q, k), call.scaling), mask))
    assert (call.weights - expected).abs().max() <= TOL
    assert bool((call.weights[0, :, j, i] == 0).all())
    assert bool((cap.calls[0].weights[0, :, j, i] > 0).all())  # untouched layers keep the edge


def test_knockout_effects_and_bad_input(tiny_model: Callable[[str], attnscope.Model],
                                        lm_heads: Callable[[str], attnscope.Model]) -> None:
    m = lm_heads("gpt2")
    r = knockout("the cat sat on the mat", [1], [5], layers=[0, 1], model=m)
    assert r.edges == [(1, 5)] and len(r.per_layer["d_target_logprob"]) == 2
    assert r.knocked["d_target_logprob"] != 0.0
    with pytest.raises(AttnscopeError, match="later token"):
        knockout("the cat sat", [3], [1], model=m)
    with pytest.raises(AttnscopeError, match="token 9 is out of range"):
        knockout("the cat sat", [9], [1], model=tiny_model("bert"))
    with pytest.raises(AttnscopeError, match="nothing to attend to"):
        knockout("the cat sat", [0], [0], model=m)
