"""The walkthrough: every step present, numbers equal to the trace's, in text, Markdown and JSON."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import attnscope
from attnscope.explain.from_trace import walkthrough
from attnscope.explain.render import to_text, walkthrough_json, walkthrough_markdown, walkthrough_renderables
from attnscope.explain.toy import toy_walkthrough

STEPS = ["tokens", "x", "projections", "q", "k", "v", "scores", "scaled", "masked", "weights", "context",
         "merged", "output"]


@pytest.fixture(scope="module")
def trace(minilm: attnscope.Model) -> attnscope.Trace:
    return attnscope.trace("time flies like an arrow", model=minilm)


def test_steps_follow_the_stage_vocabulary(trace: attnscope.Trace, minilm: attnscope.Model) -> None:
    w = walkthrough(trace, layer=2, head=5, model=minilm)
    assert [s.stage for s in w.steps] == STEPS
    assert w.check["ok"] and w.check["head_max_error"] <= attnscope.TOLERANCE


def test_numbers_are_the_traces_own(trace: attnscope.Trace, minilm: attnscope.Model) -> None:
    w = walkthrough(trace, layer=2, head=5, model=minilm)
    step = {s.stage: s for s in w.steps}
    assert np.array_equal(step["weights"].arrays["weights"], trace.weights[2, 5])
    assert np.array_equal(step["q"].arrays["q"], trace.arrays["q"][2, 5])
    scaled = step["scaled"].arrays["scaled"]
    assert np.allclose(scaled, trace.arrays["scores"][2, 5] / math.sqrt(32), atol=1e-6)
    assert np.allclose(step["weights"].arrays["row sums"], 1.0, atol=1e-6)
    w_q = step["projections"].arrays["W_Q[:, 160:192]"]  # head 5 of 12 with d_head 32
    assert np.array_equal(w_q, minilm.model.encoder.layer[2].attention.self.query.weight.detach().T[:, 160:192])


def test_token_focus_keeps_one_query_row(trace: attnscope.Trace, minilm: attnscope.Model) -> None:
    w = walkthrough(trace, layer=0, head=0, token=3, model=minilm)
    weights = next(s for s in w.steps if s.stage == "weights").arrays["weights"]
    assert weights.shape == (1, 7) and np.array_equal(weights[0], trace.weights[0, 0, 3])
    assert [s.stage for s in w.steps] == [*STEPS[:10], "weighted", *STEPS[10:]]


def test_weighted_values_sum_to_the_context_row(trace: attnscope.Trace, minilm: attnscope.Model) -> None:
    w = walkthrough(trace, layer=1, head=4, token=2, model=minilm)
    arrays = next(s for s in w.steps if s.stage == "weighted").arrays
    v, weights = trace.arrays["v"][1, 4], trace.weights[1, 4, 2]
    assert np.array_equal(arrays["weight[2, j] x v_j"], weights[:, None] * v)
    assert np.abs(arrays["sum over keys"][0] - trace.arrays["context"][1, 4, 2]).max() <= attnscope.TOLERANCE


def test_merged_step_shows_the_focused_heads_columns(trace: attnscope.Trace, minilm: attnscope.Model) -> None:
    w = walkthrough(trace, layer=0, head=7, model=minilm)
    step = next(s for s in w.steps if s.stage == "merged")
    assert np.array_equal(step.arrays["merged[:, 224:256] (head 7)"], trace.arrays["context"][0, 7])
    text = to_text(walkthrough_renderables(w, width=80), width=80)
    block = text[text.index("merged[:, 224:256]"):]
    assert "224" in block.splitlines()[1] and "255" in block.split("\n\n")[0]


def test_80_columns_never_truncate_silently(minilm: attnscope.Model) -> None:
    tr = attnscope.trace("the [SEP] column of a longer text keeps its every digit", model=minilm)
    w = walkthrough(tr, layer=0, head=0, token=3, model=minilm)
    small = walkthrough(tr, layer=0, head=0, token=3)  # without the [384, 32] weight slices: --full stays quick
    texts = {full: to_text(walkthrough_renderables(small if full else w, width=80, full=full), width=80)
             for full in (False, True)}
    for text in texts.values():
        assert max(len(line) for line in text.splitlines()) <= 80
        headers = [c.strip() for line in text.splitlines() if "┃" in line for c in line.split("┃")]
        assert all(c == "…" or "…" not in c for c in headers)  # a gap is its own column, never a cut header
        labels = [t for line in text.splitlines() if "│" in line for t in [line.split("│")[0].strip()]]
        assert f"{tr.n_tokens - 1}:[SEP]" in labels and "0:[CLS]" in labels  # labels whole, never "0:[CL…"
        assert "383" in text  # the last of 384 columns is shown, with its full header
    elided, full = texts[False], texts[True]
    assert "columns 4..381 of 384 not shown" in elided.replace("\n", " ")
    assert "not shown" not in full and f"x [{tr.n_tokens}, 384], columns 0.." in full
    assert re.search(rf"x \[{tr.n_tokens}, 384\], columns 3\d\d\.\.383\b", full)  # the last block


def test_text_markdown_and_json_renderings(trace: attnscope.Trace, minilm: attnscope.Model) -> None:
    w = walkthrough(trace, layer=0, head=0, model=minilm)
    text = to_text(walkthrough_renderables(w))
    assert "layer 0, head 0" in text and "÷ sqrt(d_head) = × 1/sqrt(d_head): ÷ sqrt(32) = ÷ 5.6569 = × 0.1768" in text
    assert "…" in text  # 384-wide x is elided visibly
    assert "check: OK" in text
    md = walkthrough_markdown(w)
    assert md.startswith("# all-MiniLM-L6-v2: layer 0, head 0") and "| 1:time |" in md
    data = walkthrough_json(w)
    assert [s["stage"] for s in data["steps"]] == STEPS
    x = next(s for s in data["steps"] if s["stage"] == "x")["arrays"]["x"]
    assert np.array_equal(np.asarray(x, dtype=np.float32), trace.arrays["x"][0])  # full arrays in JSON


def test_causal_mask_is_shown_for_decoders(tiny_model: object) -> None:
    m = tiny_model("gpt2")  # type: ignore[operator]
    tr = attnscope.trace("time flies like an arrow", model=m)
    w = walkthrough(tr, 1, 2, model=m)
    masked = next(s for s in w.steps if s.stage == "masked")
    assert "causal" in masked.text
    assert masked.arrays["mask"][0, 1] == np.finfo(np.float32).min and masked.arrays["mask"][1, 0] == 0
    assert "-inf*" in to_text(walkthrough_renderables(w))


def test_toy_walkthrough_scaled_and_unscaled() -> None:
    scaled = to_text(walkthrough_renderables(toy_walkthrough(scale=True)))
    unscaled = to_text(walkthrough_renderables(toy_walkthrough(scale=False)))
    assert "÷ sqrt(3) = ÷ 1.7321 = × 0.5774" in scaled and "9.2376" in scaled  # 16 / sqrt(3)
    assert "skipped (--no-scale)" in unscaled and "0.4683" in unscaled


def test_walkthrough_after_attention_flow(minilm: attnscope.Model) -> None:
    """A trace holding flow ([query, key], no layer axis) still explains any layer (it was an IndexError)."""
    tr = attnscope.trace("time flies", model=minilm)  # 4 tokens, fewer than the 6 layers
    tr.flow()
    w = attnscope.walkthrough(tr, layer=5, head=3)
    assert w.check["ok"] and any(s.stage == "weights" for s in w.steps)
