"""The attribution tests' models: tiny random-weight causal LMs (GPT-2, Llama, and Starcoder2, a family
attnscope has no adapter for) and encoder-decoders (T5, BART), each with the bundled MiniLM tokenizer."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import attnscope
from tests.support import seq2seq
from tests.support.families import build_model, modern_configs
from tests.support.random_models import random_models


@pytest.fixture(scope="session")
def tiny_lm(minilm: attnscope.Model) -> Callable[[str], attnscope.Model]:
    """tiny_lm("gpt2" | "llama" | "starcoder2" | "t5" | "bart") -> a random-weight model with its LM head."""
    import transformers as T

    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                 vocab_size=30522, num_key_value_heads=2)
    build: dict[str, Callable[[], torch.nn.Module]] = {
        "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=30522,
                                                       bos_token_id=101, eos_token_id=102)),
        "llama": lambda: build_model(modern_configs()["llama"](), "ForCausalLM"),
        "starcoder2": lambda: T.Starcoder2ForCausalLM(T.Starcoder2Config(**small)),
        "t5": lambda: seq2seq.build("t5"),
        "bart": lambda: seq2seq.build("bart"),
    }
    return random_models(minilm, build)
