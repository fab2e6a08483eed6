"""Leave-one-out (removed and replaced): each score against a direct forward of the edited input, and the
unperturbed-forward check failing on a wrong row."""

from __future__ import annotations

import torch

import attnscope
from attnscope.attribution.api import attribute
from attnscope.attribution.leave_one_out import baseline_id, scores_of, unperturbed_check
from attnscope.attribution.objective import build_objective

TOL = 1e-5


def _cos(m: attnscope.Model, ids: torch.Tensor, ref: torch.Tensor) -> float:
    with torch.no_grad():
        pooled = m.model(input_ids=ids[None]).last_hidden_state[0].mean(dim=0)
    return float(torch.nn.functional.cosine_similarity(pooled, ref, dim=0))


def test_minilm_removed_and_replaced(minilm: attnscope.Model) -> None:
    a = attribute("time flies like an arrow", model=minilm, methods="leave_one_out,leave_one_out_replaced")
    obj = build_objective(minilm, "time flies like an arrow")
    assert obj.pooled is not None and minilm.tokenizer.convert_ids_to_tokens(baseline_id(minilm)) == "[MASK]"
    for i in range(obj.n_tokens):
        removed = 1.0 - _cos(minilm, torch.cat([obj.ids[:i], obj.ids[i + 1:]]), obj.pooled)
        masked = obj.ids.clone()
        masked[i] = baseline_id(minilm)
        replaced = 1.0 - _cos(minilm, masked, obj.pooled)
        assert abs(a.scores("leave_one_out")[0, i] - removed) <= TOL
        assert abs(a.scores("leave_one_out_replaced")[0, i] - replaced) <= TOL
    for ms in a.methods.values():
        assert ms.check.verified is True and ms.cost.forwards == obj.n_tokens + 1


def test_smollm2_paris(smollm2: attnscope.Model) -> None:
    a = attribute("The capital of France is", model=smollm2, methods="leave_one_out")
    ms = a.methods["leave_one_out"]
    assert a.targets == [" Paris"] and ms.check.verified is True and ms.check.value <= TOL
    obj = build_objective(smollm2, "The capital of France is")
    with torch.no_grad():  # " France" removed, computed directly
        lp = smollm2.model(input_ids=torch.cat([obj.ids[:3], obj.ids[4:]])[None]).logits[0, -1].log_softmax(-1)
    expected = float(obj.reference[0]) - float(lp[obj.target_ids[0]])
    assert abs(ms.scores[0, 3] - expected) <= TOL * max(1.0, abs(expected))
    assert ms.scores[0, 3] > 1.0  # without " France", " Paris" loses more than a nat


def test_reusable_helpers_and_a_wrong_row_fails(minilm: attnscope.Model) -> None:
    obj = build_objective(minilm, "time flies like an arrow")
    rows = scores_of(obj, removed=[[], [1, 2]])  # [variant, target]: nothing removed; two tokens removed at once
    assert rows.dtype == torch.float64 and rows.shape == (2, 1)
    assert unperturbed_check(obj, rows[0]).verified is True
    assert unperturbed_check(obj, rows[0] + 1e-3).verified is False
    assert unperturbed_check(obj, rows[1]).verified is False  # an edited row is not the model's forward
