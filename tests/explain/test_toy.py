"""The toy example: numpy numbers equal to the taught torch maths and to an independent einsum, no torch import."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from attnscope import maths
from attnscope.explain.render import to_text, walkthrough_renderables
from attnscope.explain.toy import TUTORIAL_WEIGHTS_1, W_K, W_Q, W_V, X, toy_stages, toy_walkthrough


@pytest.mark.parametrize("scale, causal", [(True, False), (False, False), (True, True), (False, True)])
def test_toy_equals_the_taught_torch_maths(scale: bool, causal: bool) -> None:
    st = toy_stages(scale, causal)
    x = torch.tensor(X, dtype=torch.float64)
    q, k, v = (x @ torch.tensor(w, dtype=torch.float64) for w in (W_Q, W_K, W_V))
    mask = maths.causal_mask(3, torch.float64) if causal else None
    context, weights = maths.attention(q, k, v, mask, 3 ** -0.5 if scale else 1.0)
    assert np.abs(st["weights"] - weights.numpy()).max() <= 1e-12
    assert np.abs(st["context"] - context.numpy()).max() <= 1e-12


def test_weighted_values_equal_a_numpy_computation() -> None:
    st = toy_stages(scale=False)
    v = np.asarray(X, dtype=np.float64) @ np.asarray(W_V, dtype=np.float64)
    for i in range(3):
        for j in range(3):
            assert np.array_equal(st["weighted"][i, j], st["weights"][i, j] * v[j])
    assert np.allclose(np.einsum("qk,kd->qd", st["weights"], v), st["context"], atol=1e-12, rtol=0)
    assert np.allclose(st["context"][0], [1.9366, 6.6831, 1.5951], atol=5e-5)  # the output 1


def test_steps_are_numbered_as_the_classic_seven() -> None:
    w = toy_walkthrough(scale=False)
    assert [s.number for s in w.steps] == ["1", "2", "3a", "3b", "3c", "4", "4b", "5", "6", "7"]
    text = to_text(walkthrough_renderables(w), width=80)
    assert "6. Multiply each value by its weight" in text and "7. Sum the weighted values" in text
    hand = np.asarray(TUTORIAL_WEIGHTS_1) @ toy_stages(scale=False)["v"]
    assert f"tutorial gets [{hand[0]:.1f}, {hand[1]:.1f}, {hand[2]:.1f}]" in text.replace("\n", " ")
    assert max(len(line) for line in text.splitlines()) <= 80


def test_causal_mask_hides_the_future_and_names_the_rows_it_changes() -> None:
    st = toy_stages(scale=True, causal=True)
    assert np.isneginf(st["mask"][0, 1]) and st["mask"][1, 0] == 0 and np.all(np.triu(st["weights"], 1) == 0)
    plain = toy_stages(scale=True)["weights"]
    assert np.array_equal(st["weights"][2], plain[2]) and not np.array_equal(st["weights"][1], plain[1])
    w = toy_walkthrough(causal=True)
    mask_step = next(s for s in w.steps if s.stage == "masked")
    assert mask_step.number == "4c" and "input 1, input 2;" in mask_step.text
    assert "-inf" in to_text(walkthrough_renderables(w), width=80)


def test_the_toy_command_imports_neither_torch_nor_transformers() -> None:
    code = ("import sys; from attnscope.cli.main import main; main(['toy', '--causal']); "
            "print('HEAVY', [m for m in ('torch', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "HEAVY []" in out.stdout and "4c. Causal mask" in out.stdout
