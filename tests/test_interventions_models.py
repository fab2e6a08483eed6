"""The intervention tests' models: with a language-model head, and one of every family (a fixture module: it
holds no tests)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import attnscope
from test_families import _build, _configs

# every decoder and encoder family check supports (tests/test_interventions.py asserts it, naming the exclusions)
EVERY_FAMILY = ("bert", "roberta", "electra", "distilbert", "albert", "gpt2", "llama", "mistral", "qwen2", "qwen3",
                "gemma2", "phi3", "gpt_neox", "olmo2", "gpt_oss", "modernbert")
# every encoder-decoder family check supports: their gates (by kind) are tested in tests/test_interventions_seq2seq.py
EVERY_ENCODER_DECODER = ("t5", "bart", "mbart", "marian")


@pytest.fixture(scope="session")
def lm_heads(minilm: attnscope.Model) -> Callable[[str], attnscope.Model]:
    """Tiny random-weight models with a language-model head: gpt2, llama (causal), bert (masked)."""
    import transformers as T

    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    build = {
        "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=30522)),
        "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**small, num_key_value_heads=2, vocab_size=30522)),
        "bert": lambda: T.BertForMaskedLM(T.BertConfig(**small)),
    }
    cache: dict[str, attnscope.Model] = {}

    def get(name: str) -> attnscope.Model:
        if name not in cache:
            torch.manual_seed(0)
            model = build[name]()
            model.config._attn_implementation = "eager"
            cache[name] = attnscope.load_model(model.eval(), tokenizer=minilm.tokenizer)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def any_family(tiny_model: Callable[[str], attnscope.Model],
               minilm: attnscope.Model) -> Callable[[str], attnscope.Model]:
    """any_family("gemma2") -> a tiny random-weight model of that family: conftest's tiny models for the
    first families, test_families' configs for the modern ones (RoPE, GQA, windows, sinks, QK-norm). Eager
    attention, as load_model loads a model: the gates edit the eager attention, so "untouched" means that."""
    cache: dict[str, attnscope.Model] = {}

    def get(name: str) -> attnscope.Model:
        if name not in _configs():
            return tiny_model(name)
        if name not in cache:
            model = _build(_configs()[name]())
            model.config._attn_implementation = "eager"
            cache[name] = attnscope.load_model(model, tokenizer=minilm.tokenizer)
        return cache[name]

    return get
