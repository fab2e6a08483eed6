"""The text part of Gemma3ForConditionalGeneration (issue 30), on random weights: the families read its
text_config and its language model, so trace, check, generation, head gates and the CLI treat it as they treat
Gemma3ForCausalLM; the vision tower's SigLIP attention is not mistaken for a text layer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attnscope
from attnscope import families
from attnscope.cli.main import main
from attnscope.interventions.gates import HeadEdit, ones, run
from attnscope.verify.recompute import RECOMPUTED_STAGES
from tests.support.families import WINDOW, gemma3_multimodal

TEXT = "The capital of France is a city on the river"  # longer than the sliding window


@pytest.fixture(scope="module")
def gemma3_mm(minilm: attnscope.Model) -> attnscope.Model:
    return attnscope.load_model(gemma3_multimodal(), tokenizer=minilm.tokenizer)


def test_the_text_part_is_read_through_its_text_config(gemma3_mm: attnscope.Model) -> None:
    model = gemma3_mm.model
    assert model.config.model_type == "gemma3" and families.family_of(model) is not None
    assert type(families.base_of(model)).__name__ == "Gemma3TextModel"
    assert (gemma3_mm.n_layers, gemma3_mm.n_heads) == (2, 4)
    assert [type(m).__name__ for m in families.layer_modules(model)] == ["Gemma3Attention"] * 2  # no SigLIP


def test_every_stage_is_recomputed_and_verified(gemma3_mm: attnscope.Model) -> None:
    tr = attnscope.trace(TEXT, model=gemma3_mm)
    report = tr.check()
    assert report.status == "PASS" and report.unsupported is None, report.to_dict()
    assert {c.stage for c in report.comparisons if c.source == "recompute"} == set(RECOMPUTED_STAGES)
    assert tr.model["family"] == "gemma3_text" and tr.kv_heads == 1
    last = tr.n_tokens - 1  # layer 0 slides: keys more than WINDOW - 1 back are hidden, layer 1 is global
    assert (tr.weights[0, :, last, : last - WINDOW + 1] == 0).all() and (tr.weights[1, :, last, :] > 0).all()


def test_greedy_generation_equals_transformers_and_is_verified(gemma3_mm: attnscope.Model) -> None:
    g = attnscope.generate("The capital of France is", model=gemma3_mm, max_new_tokens=4)
    enc = gemma3_mm.tokenizer("The capital of France is", return_tensors="pt", return_token_type_ids=False)
    with torch.no_grad():
        expected = gemma3_mm.model.generate(**enc, max_new_tokens=4, do_sample=False)  # type: ignore[operator]
    assert [t.id for t in g.tokens] == [int(i) for i in expected[0]]
    assert g.check().ok, g.check().max_error


def test_open_head_gates_change_nothing_bit_for_bit(gemma3_mm: attnscope.Model) -> None:
    inputs = dict(gemma3_mm.tokenizer([TEXT, "Paris is"], return_tensors="pt", padding=True,
                                      return_token_type_ids=False))
    with torch.no_grad():
        plain = gemma3_mm.model(**inputs, output_hidden_states=True)
        gated = run(gemma3_mm, inputs, HeadEdit(gemma3_mm.n_layers, ones(gemma3_mm, 2)), output_hidden_states=True)
    assert torch.equal(plain.logits, gated.logits)


def test_cli_check_of_a_saved_checkpoint_passes(tmp_path: Path, gemma3_mm: attnscope.Model,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    gemma3_mm.model.save_pretrained(tmp_path)
    gemma3_mm.tokenizer.save_pretrained(tmp_path)
    code = main(["check", TEXT, "--model", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and "PASS" in out and "NOT VERIFIED" not in out, out
