"""One cache of tiny random-weight models for the conftests: each built once per session (torch seed 0 just
before building), eager attention as load_model loads a checkpoint, with the bundled MiniLM tokenizer."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import torch
import transformers as T

import attnscope


def random_models(tokenizer_of: attnscope.Model,
                  build: Mapping[str, Callable[[], torch.nn.Module]]) -> Callable[[str], attnscope.Model]:
    """get(name) -> attnscope.load_model(build[name]()) with tokenizer_of's tokenizer, the same object every call."""
    cache: dict[str, attnscope.Model] = {}

    def get(name: str) -> attnscope.Model:
        if name not in cache:
            torch.manual_seed(0)
            model = build[name]()
            model.config._attn_implementation = "eager"
            cache[name] = attnscope.load_model(model.eval(), tokenizer=tokenizer_of.tokenizer)
        return cache[name]

    return get


def save_random_bert(path: Path) -> Path:
    """A random-weight BERT (2 layers, 2 heads, d_model 32; torch seed 0) with the bundled MiniLM's tokenizer, saved
    in path: a model a server can serve that an index or a heads pass was not built with."""
    torch.manual_seed(0)
    model = T.BertModel(T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, vocab_size=30522))
    model.save_pretrained(path)
    attnscope.load_model().tokenizer.save_pretrained(path)
    return path


__all__ = ["random_models", "save_random_bert"]
