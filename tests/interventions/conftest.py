"""The intervention tests' models: with a language-model head, and one of every family."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import attnscope
from tests.support.families import build_model, modern_configs
from tests.support.random_models import random_models


@pytest.fixture(scope="session")
def lm_heads(minilm: attnscope.Model) -> Callable[[str], attnscope.Model]:
    """Tiny random-weight models with a language-model head: gpt2, llama (causal), bert (masked)."""
    import transformers as T

    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    build: dict[str, Callable[[], torch.nn.Module]] = {
        "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=30522)),
        "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**small, num_key_value_heads=2, vocab_size=30522)),
        "bert": lambda: T.BertForMaskedLM(T.BertConfig(**small)),
    }
    return random_models(minilm, build)


@pytest.fixture(scope="session")
def any_family(tiny_model: Callable[[str], attnscope.Model],
               minilm: attnscope.Model) -> Callable[[str], attnscope.Model]:
    """any_family("gemma2") -> a tiny random-weight model of that family: conftest's tiny models for the
    first families, tests/support/families.py for the modern ones (RoPE, GQA, windows, sinks, QK-norm). Eager
    attention, as load_model loads a model: the gates edit the eager attention, so "untouched" means that."""
    cache: dict[str, attnscope.Model] = {}

    def get(name: str) -> attnscope.Model:
        if name not in modern_configs():
            return tiny_model(name)
        if name not in cache:
            model = build_model(modern_configs()[name]())
            model.config._attn_implementation = "eager"
            cache[name] = attnscope.load_model(model, tokenizer=minilm.tokenizer)
        return cache[name]

    return get
