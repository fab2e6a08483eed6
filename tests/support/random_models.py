"""One cache of tiny random-weight models for the conftests: each built once per session (torch seed 0 just
before building), eager attention as load_model loads a checkpoint, with the bundled MiniLM tokenizer."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

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


__all__ = ["random_models"]
