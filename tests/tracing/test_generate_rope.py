"""Generation on a random-weight Llama with dynamic RoPE scaling: verified up to its positions, refused past them."""

from __future__ import annotations

import pytest
import torch
import transformers as T

import attnscope
from attnscope.errors import AttnscopeError
from attnscope.tracing.decoding import generate

PROMPT = "time flies like an arrow"
MAX_POSITIONS = 12


@pytest.fixture(scope="module")
def dynamic_llama(minilm: attnscope.Model) -> attnscope.Model:
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=30522, bos_token_id=101, eos_token_id=None, max_position_embeddings=MAX_POSITIONS,
        rope_scaling={"rope_type": "dynamic", "factor": 2.0}))
    model.config._attn_implementation = "eager"
    model.eval()  # type: ignore[no-untyped-call]
    return attnscope.load_model(model, tokenizer=minilm.tokenizer)


def test_dynamic_rope_generation_to_the_last_position_is_verified(dynamic_llama: attnscope.Model) -> None:
    n_prompt = len(dynamic_llama.tokenizer(PROMPT)["input_ids"])
    g = generate(PROMPT, model=dynamic_llama, max_new_tokens=MAX_POSITIONS - n_prompt)
    with torch.no_grad():
        plain = dynamic_llama.model.generate(  # type: ignore[operator]
            input_ids=torch.tensor([[t.id for t in g.prompt_tokens]]), max_new_tokens=g.n_steps, do_sample=False,
            pad_token_id=0)
    assert [t.id for t in g.tokens] == [int(i) for i in plain[0]]
    assert g.prompt_length + g.n_steps == MAX_POSITIONS
    report = g.check()
    assert report.ok and report.unsupported is None, report.to_dict()
    assert {c.source for c in report.comparisons} == {"recompute", "no-cache"}


def test_dynamic_rope_past_its_positions_is_refused_in_one_line(dynamic_llama: attnscope.Model) -> None:
    n_prompt = len(dynamic_llama.tokenizer(PROMPT)["input_ids"])
    with pytest.raises(AttnscopeError, match=r"dynamic RoPE.*so use at most") as info:
        generate(PROMPT, model=dynamic_llama, max_new_tokens=MAX_POSITIONS - n_prompt + 1)
    assert "\n" not in str(info.value)
