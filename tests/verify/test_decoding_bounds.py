"""The generation check's no-cache bounds follow float32 rounding: the README's example and hard prompts pass,
a difference just past the bound still fails (verify/decoding.py, _scale)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnscope
from attnscope.verify.decoding import verify_generation
from attnscope.verify.recompute import layer_params

STAGES = ("x", "q", "k", "v", "weights", "context", "output")


@pytest.fixture(scope="module")
def capital(smollm2: attnscope.Model) -> attnscope.GenerationTrace:
    return attnscope.generate("The capital of France is", model=smollm2, max_new_tokens=20)


def test_the_readme_example_passes(capital: attnscope.GenerationTrace) -> None:
    report = capital.check()
    assert report.ok and report.status == "PASS", report.max_error
    assert capital.n_steps == 20


@pytest.mark.parametrize("prompt", ["The capital\x00 of\x00 France is", "\x00\x00\x00 hello \x00"])
def test_prompts_with_nul_characters_pass(smollm2: attnscope.Model, prompt: str) -> None:
    report = attnscope.generate(prompt, model=smollm2, max_new_tokens=20).check()
    assert report.ok, [(c.stage, c.source, float(c.errors.max())) for c in report.comparisons]


def _verify(m: attnscope.Model, g: attnscope.GenerationTrace,
            edit: tuple[str, int, tuple[int, ...], float] | None = None) -> dict[tuple[str, str], float]:
    """The generation's comparisons from its saved rows (one stage's element moved by `edit`'s amount)."""
    layers = {s: [torch.from_numpy(np.array(a))[None] for a in g.trace.arrays[s]] for s in STAGES}
    if edit is not None:
        stage, layer, index, delta = edit
        layers[stage][layer][(0, *index)] += delta
    ids = torch.tensor([[t.id for t in g.trace.tokens]])
    comparisons, _ = verify_generation(m, layers, ids, g.prompt_length, g.n_steps)
    return {(c.stage, c.source): float(c.errors.max()) for c in comparisons}


def test_a_difference_past_the_bound_fails(smollm2: attnscope.Model, capital: attnscope.GenerationTrace) -> None:
    """Move one output element by 2e-5 of its scale |merged_t| |W_O[:, j]| and one context element by 2e-5 of
    max |v| read: each no-cache comparison then reports about 2e-5, over the tolerance 1e-5."""
    clean = _verify(smollm2, capital)
    assert max(clean.values()) <= 1e-5
    layer, token, j = 12, 9, 7
    p = layer_params(smollm2.model, len(capital.trace.tokens) + 1)
    assert p is not None
    ctx = torch.from_numpy(np.array(capital.trace.arrays["context"][layer]))  # [head, token, d_head]
    merged = float(ctx[:, token].flatten().norm())
    scale = max(1.0, merged * float(p[layer].w_o.norm(dim=0)[j]))
    moved = _verify(smollm2, capital, ("output", layer, (token, j), 2e-5 * scale))
    assert moved[("output", "no-cache")] == pytest.approx(2e-5, rel=0.2)
    assert moved[("output", "recompute")] > 1e-5  # the step recompute sees it too
    v = np.abs(np.array(capital.trace.arrays["v"][layer][0, : token + 1]))  # head 0 reads k/v head 0
    moved = _verify(smollm2, capital, ("context", layer, (0, token, 3), 2e-5 * max(1.0, float(v.max()))))
    assert moved[("context", "no-cache")] == pytest.approx(2e-5, rel=0.2)


def test_the_explain_verdict_states_the_head_and_the_trace_apart(capital: attnscope.GenerationTrace) -> None:
    from attnscope.explain.render import check_line
    from attnscope.explain.steps import Walkthrough

    w = Walkthrough(capital.model, 3, 2, None, [], [], {"ok": False, "tolerance": 1e-5, "head_max_error": 2.4e-6,
                                                         "max_error": 1.8e-5}, "self", None)
    line = check_line(w)
    assert line.startswith("check: OK: every stage of layer 3 head 2") and "whole trace: FAIL" in line
    w.check.update(ok=True, head_max_error=float("nan"))
    assert check_line(w).startswith("check: FAILED: a stage of layer 3 head 2")
