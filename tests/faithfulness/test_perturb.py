"""Masks scored by the real model: the empty mask is the model's own forward, a mask is the model's forward of
the modified text, special tokens are never removed (MiniLM; SmolLM2 in one test)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnscope
from attnscope.attribution.leave_one_out import baseline_id
from attnscope.attribution.objective import build_objective, mean_pool
from attnscope.errors import AttnscopeError
from attnscope.faithfulness.perturb import Perturber
from attnscope.records.check_report import TOLERANCE

TEXT = "The quick brown fox jumps over the lazy dog ."


def random_keep(p: Perturber, rows: int, seed: int = 0) -> np.ndarray:
    ex = p.example()
    keep = np.ones((rows, ex.n_tokens), dtype=bool)
    keep[:, ex.removable] = np.random.default_rng(seed).random((rows, ex.m)) > 0.4
    keep[:, np.flatnonzero(ex.removable)[0]] = True  # never empty
    return keep


def own_cosine(m: attnscope.Model, ids: torch.Tensor, pooled: torch.Tensor) -> float:
    """The model's ordinary forward of ids [token] and its pooled embedding's cosine with pooled."""
    with torch.no_grad():
        mask = torch.ones(1, len(ids), dtype=torch.long)
        out = m.base(input_ids=ids[None], attention_mask=mask, token_type_ids=torch.zeros_like(mask))
    return float(F.cosine_similarity(mean_pool(out.last_hidden_state, mask), pooled[None], dim=-1)[0])


@pytest.mark.parametrize("removal", ["delete", "replace"])
def test_minilm_masks_are_the_models_own_forward_of_the_modified_text(minilm: attnscope.Model,
                                                                     removal: str) -> None:
    obj = build_objective(minilm, TEXT)
    p = Perturber(obj, removal)
    keep = random_keep(p, 5)
    assert p.unperturbed_error() == 0.0  # measured: bit for bit on MiniLM, alone and in a batch
    assert p.unperturbed_error(keep) <= TOLERANCE
    got = p.measure(keep)  # [variant]
    for row, k in zip(got, keep, strict=True):
        ids = obj.ids[torch.from_numpy(k)] if removal == "delete" else torch.where(
            torch.from_numpy(k), obj.ids, baseline_id(minilm))
        assert obj.pooled is not None
        assert abs(row - own_cosine(minilm, ids, obj.pooled)) <= TOLERANCE
    assert (got < 1 - 1e-3).all()  # every modification moved the embedding


def test_special_tokens_are_not_removable(minilm: attnscope.Model) -> None:
    obj = build_objective(minilm, TEXT)
    p = Perturber(obj, "delete")
    ex = p.example()
    assert not ex.removable[0] and not ex.removable[-1] and ex.removable[1:-1].all()  # [CLS] ... [SEP]
    assert ex.min_kept == 0  # [CLS] and [SEP] stay: deleting every word leaves an input
    keep = np.ones((1, ex.n_tokens), dtype=bool)
    keep[0, 0] = False
    with pytest.raises(AttnscopeError, match="not removable"):
        p.measure(keep)
    with pytest.raises(AttnscopeError, match="unknown removal 'drop'"):
        Perturber(obj, "drop")


def test_smollm2_delete_keeps_a_token_and_a_targets_prefix_stays(smollm2: attnscope.Model) -> None:
    obj = build_objective(smollm2, "The capital of France is", " Paris, France")
    p = Perturber(obj, "delete")
    ex = p.example()
    n_text = obj.positions[0] + 1
    assert ex.removable[:n_text].all() and not ex.removable[n_text:].any()  # the target's prefix is not removable
    assert ex.min_kept == 1 and Perturber(obj, "replace").example().min_kept == 0  # no BOS to keep
    assert ex.full == pytest.approx(float(obj.reference.double().sum()), abs=0)
    assert p.unperturbed_error() <= TOLERANCE and p.unperturbed_error(random_keep(p, 4)) <= TOLERANCE
    keep = np.ones((1, ex.n_tokens), dtype=bool)
    keep[0, 3] = False  # " France" removed
    ids = obj.ids[torch.from_numpy(keep[0])]
    with torch.no_grad():
        logits = smollm2.model(input_ids=ids[None]).logits[0].double()  # [token, vocab]
    lp = logits.log_softmax(-1)
    moved = [p_ - 1 for p_ in obj.positions]
    own = sum(float(lp[q, t]) for q, t in zip(moved, obj.target_ids, strict=True))
    assert abs(p.measure(keep)[0] - own) <= TOLERANCE * max(1.0, abs(own))
