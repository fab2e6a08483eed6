"""Generation on every causal family that check verifies: greedy equals model.generate, every step verified."""

from __future__ import annotations

import pytest
import torch

import attnscope
from attnscope import generate
from tests.support.families import build_model, modern_configs

# llama and gpt2: tests/tracing/test_generate.py. Mistral, Qwen2, Gemma 2, Phi-3 and GPT-OSS generate past their sliding
# windows (4 tokens), where the cache keeps only the last keys.
CAUSAL = ["mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "gpt_neox", "olmo2", "gpt_oss"]
PROMPT = "the quick brown fox jumps"  # longer than the sliding windows (4 tokens) of the families that have them


@pytest.mark.parametrize("family", CAUSAL)
def test_generation_of_each_causal_family_is_verified(family: str, minilm: attnscope.Model) -> None:
    config = modern_configs()[family]()
    config.eos_token_id = None  # generate every asked token
    m = attnscope.load_model(build_model(config, "ForCausalLM"), tokenizer=minilm.tokenizer)
    g = generate(PROMPT, model=m, max_new_tokens=4)
    enc = minilm.tokenizer(PROMPT, return_tensors="pt")
    with torch.no_grad():
        expected = m.model.generate(  # type: ignore[operator]
            input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], max_new_tokens=4, do_sample=False)
    assert [t.id for t in g.tokens] == [int(i) for i in expected[0]]
    report = g.check()
    assert report.ok, report.to_dict()
    assert {c.source for c in report.comparisons} == {"recompute", "no-cache"}

