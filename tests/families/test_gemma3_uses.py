"""The real Gemma 3 270M beyond the check (issue 30): ablate, patch and knockout measure it through its language
model head, the views draw its trace (four query heads on one k/v head), and `stats` computes the same numbers
as its traces."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import torch

import attnscope
from attnscope.interventions.ablate import ablate
from attnscope.interventions.knockout import knockout
from attnscope.interventions.patch import patch
from attnscope.stats import Settings, Source, process_documents
from attnscope.views import payload, to_html

PROMPT = "The capital of France is"


def _logprob(m: attnscope.Model, text: str, continuation: str) -> float:
    """log p(continuation's first token | text) from the model's own forward pass."""
    ids = m.tokenizer(text, return_tensors="pt")["input_ids"]
    target = m.tokenizer(continuation, add_special_tokens=False)["input_ids"][0]
    with torch.no_grad():
        logits = m.model(input_ids=ids).logits[0, -1].double()
    return float(torch.log_softmax(logits, -1)[target])


def test_ablate_measures_the_model_and_a_head_grid(gemma3: attnscope.Model) -> None:
    r = ablate(PROMPT, heads=[(5, 1)], model=gemma3, target=" the", each=True)
    assert abs(r.clean["target_logprob"] - _logprob(gemma3, PROMPT, " the")) <= 1e-4
    assert np.isfinite(r.ablated["d_target_logprob"]) and r.ablated["d_target_logprob"] != 0.0
    grid = r.grid["d_target_logprob"]
    assert grid.shape == (18, 4) and np.isfinite(grid).all()
    assert abs(grid[5, 1] - r.ablated["d_target_logprob"]) <= 1e-4  # the head alone, in the grid and asked for


def test_patch_and_knockout_run_through_its_head(gemma3: attnscope.Model) -> None:
    p = patch("The capital of France is the city of", "The capital of Spain is the city of", model=gemma3,
              target=" Paris", contrast=" Madrid")
    assert p.denoised.shape == p.noised.shape == (18, 4)
    assert np.isfinite(p.denoised).all() and p.clean != p.corrupt
    k = knockout(PROMPT, from_tokens=[4], to_tokens=[5], model=gemma3, target=" the")  # France -> the last token
    assert abs(k.clean["target_logprob"] - _logprob(gemma3, PROMPT, " the")) <= 1e-4
    assert np.isfinite(k.knocked["d_target_logprob"])


def test_views_draw_its_trace(gemma3: attnscope.Model) -> None:
    tr = attnscope.trace(PROMPT, model=gemma3)
    p = payload(tr, None, None, "budget")
    assert p["model"]["kv_heads"] == 1 and len(p["tokens"]) == tr.n_tokens
    html = to_html(tr, "all")
    assert "Gemma3ForCausalLM" in html and "<script src=" not in html


def test_stats_equal_its_traces(gemma3: attnscope.Model, ud_dev: Path) -> None:
    docs = list(itertools.islice(Source(str(ud_dev)), 3))
    state = process_documents(gemma3, docs, Settings(batch_size=3))  # one padded batch
    traces = [attnscope.trace(d.text, model=gemma3) for d in docs]
    assert state.tokens == sum(t.n_tokens for t in traces)
    expected = np.mean([t.weights.astype(np.float64)[:, :, 1:, 0].mean(-1) for t in traces], axis=0)
    assert np.abs(state.mean("sink") - expected).max() <= 1e-5  # the share on token 0 (<bos>)
