"""Head importance: the gradients equal finite differences (float64 copies of tiny models), the run
checkpoints and resumes to the same numbers, and its report holds the curve and the correlation."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import attnscope
from attnscope.capture import intervening
from attnscope.errors import AttnscopeError
from attnscope.interventions.gates import HeadEdit
from attnscope.interventions.importance import (
    ImportanceSettings,
    accumulate,
    embedding_gradients,
    loss_gradients,
    masked_positions,
    row_losses,
    unit_embedding,
)
from attnscope.interventions.importance_report import importance
from attnscope.tokens import encode

TEXTS = ["the cat sat on the mat", "dogs bark", "a bird sings in the tree at dawn", "rain"]
EPS = 1e-5
HEADS = [(0, 0), (0, 3), (1, 2)]


def _double(m: attnscope.Model) -> attnscope.Model:
    return attnscope.load_model(copy.deepcopy(m.model).double(), tokenizer=m.tokenizer)


def _at(m: attnscope.Model, layer: int, head: int, value: float) -> HeadEdit:
    gates = torch.ones(m.n_layers, 1, m.n_heads, dtype=torch.float64)
    gates[layer, 0, head] = value
    return HeadEdit(m.n_layers, gates)


# causal LMs (llama: grouped k/v heads, RoPE) and a masked LM. Llama's RMSNorm and rotation compute in float32
# even in a float64 model: its loss carries float32 rounding, so a larger step (1e-3) and a 1e-5 absolute tolerance
@pytest.mark.parametrize(("family", "eps", "atol"), [("gpt2", EPS, 1e-6), ("llama", 1e-3, 1e-5), ("bert", EPS, 1e-6)])
def test_loss_gradient_equals_finite_difference(lm_heads: Callable[[str], attnscope.Model], family: str, eps: float,
                                                atol: float) -> None:
    m = _double(lm_heads(family))
    inputs = encode(m.tokenizer, TEXTS[2:3]).inputs
    grad = loss_gradients(m, inputs)  # [layer, head]
    for layer, head in HEADS:
        with torch.no_grad():
            with intervening(m.model, _at(m, layer, head, 1 + eps)):
                up = float(row_losses(m, inputs)[0])
            with intervening(m.model, _at(m, layer, head, 1 - eps)):
                down = float(row_losses(m, inputs)[0])
        fd = abs(up - down) / (2 * eps)
        assert abs(float(grad[layer, head]) - fd) <= atol + 1e-5 * fd
        assert fd > 1e-6  # the head matters at all: the comparison can fail


def test_embedding_gradient_equals_finite_difference(tiny_model: Callable[[str], attnscope.Model]) -> None:
    m = _double(tiny_model("bert"))
    inputs = encode(m.tokenizer, TEXTS[:2]).inputs
    grad = embedding_gradients(m, inputs)  # [layer, head], summed over the 2 documents
    for layer, head in HEADS:
        fd = 0.0
        for row in range(2):
            one = {k: v[row : row + 1, : int(inputs["attention_mask"][row].sum())] for k, v in inputs.items()}
            with torch.no_grad():
                with intervening(m.model, _at(m, layer, head, 1 + EPS)):
                    up = unit_embedding(m, one)
                with intervening(m.model, _at(m, layer, head, 1 - EPS)):
                    down = unit_embedding(m, one)
            fd += float(((up - down) / (2 * EPS)).norm())
        assert abs(float(grad[layer, head]) - fd) <= 1e-6 + 1e-5 * fd
        assert fd > 1e-6


def test_resume_gives_the_same_sums(lm_heads: Callable[[str], attnscope.Model], tmp_path: Path) -> None:
    m = lm_heads("gpt2")
    settings = ImportanceSettings(batch_size=1, checkpoint_every=1, sample=2)
    whole = accumulate(m, TEXTS, tmp_path / "whole", {"spec": "t"}, settings)
    accumulate(m, TEXTS[:2], tmp_path / "part", {"spec": "t"}, settings)  # stops after 2 documents
    resumed = accumulate(m, TEXTS, tmp_path / "part", {"spec": "t"}, settings, resume=True)
    assert resumed.documents == whole.documents == 4
    assert np.allclose(resumed.total, whole.total, rtol=1e-6, atol=1e-9)
    with pytest.raises(AttnscopeError, match="not empty"):
        accumulate(m, TEXTS, tmp_path / "part", {"spec": "t"}, settings)
    with pytest.raises(AttnscopeError, match="other arguments"):
        accumulate(m, TEXTS, tmp_path / "part", {"spec": "other"}, settings, resume=True)


def test_report_has_curve_and_correlation(tiny_model: Callable[[str], attnscope.Model], tmp_path: Path) -> None:
    m = tiny_model("bert")
    r = importance(m, TEXTS, tmp_path / "out", {"spec": "t"}, ImportanceSettings(batch_size=2, sample=3))
    assert np.allclose(np.linalg.norm(r.normalised, axis=1), 1.0)
    assert r.curve[0][0] == 0 and abs(r.curve[0][1]) <= 1e-6  # nothing removed: no change
    assert r.curve[-1][0] == m.n_layers * m.n_heads and len(r.curve) >= 5
    assert -1.0 <= r.spearman <= 1.0 and r.ablation.shape == (m.n_layers, m.n_heads)
    saved = json.loads((tmp_path / "out" / "importance.json").read_text())
    assert saved["documents"] == 4 and "Rank correlation" in (tmp_path / "out" / "report.md").read_text()


def test_masked_lm_scores_every_seventh_content_token(lm_heads: Callable[[str], attnscope.Model]) -> None:
    m = lm_heads("bert")
    inputs = encode(m.tokenizer, ["one two three four five six seven eight nine ten", "rain"]).inputs
    chosen = masked_positions(m, inputs)
    assert chosen[0].nonzero().flatten().tolist() == [1, 8]  # after [CLS]: the 1st and 8th words
    assert chosen[1].nonzero().flatten().tolist() == [1]
