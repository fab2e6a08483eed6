"""attribution.blocks: the capture stops after the last layer's attention block, and what it keeps is the full
forward pass's own; map_blocks hands each block over inside the forward pass, one layer at a time."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch

import attnscope
from attnscope.attribution.blocks import LayerBlock, capture_blocks, map_blocks
from attnscope.capture import capturing
from attnscope.families import layer_modules
from tests.support.families import build_model, modern_configs

TEXT = "The capital of France is Paris, a city of light."


def inputs(m: attnscope.Model) -> dict[str, torch.Tensor]:
    return dict(m.tokenizer(TEXT, return_tensors="pt"))


def hooks(model: torch.nn.Module) -> int:
    return sum(len(mod._forward_hooks) + len(mod._forward_pre_hooks) for mod in model.modules())


def assert_stops_and_keeps(m: attnscope.Model, last_mlp: torch.nn.Module) -> None:
    with torch.no_grad(), capturing(m.model) as cap:
        m.base(**inputs(m))  # the whole forward pass, nothing stopped
    before, registered = m.model.config._attn_implementation, hooks(m.model)
    count = [0]
    handle = last_mlp.register_forward_hook(lambda *_: count.__setitem__(0, count[0] + 1))
    try:
        for whole_block in (True, False):
            blocks = capture_blocks(m, inputs(m), whole_block=whole_block)
            assert count[0] == 0  # the last layer's MLP never ran
            assert len(blocks) == m.n_layers
            for block, call, output in zip(blocks, cap.calls, cap.output, strict=True):
                assert torch.equal(block.weights, call.weights[0].double())
                assert torch.equal(block.output, output[0].double())
        assert m.model.config._attn_implementation == before and hooks(m.model) == registered + 1
        with torch.no_grad():
            m.base(**inputs(m))  # the model runs whole again afterwards: the stopping hook is gone
        assert count[0] == 1
    finally:
        handle.remove()


def test_the_capture_stops_after_the_last_attention_block_on_minilm(minilm: attnscope.Model) -> None:
    assert_stops_and_keeps(minilm, minilm.model.encoder.layer[-1].output)


def test_the_capture_stops_after_the_last_attention_block_on_smollm2(smollm2: attnscope.Model) -> None:
    base: Any = smollm2.base
    assert_stops_and_keeps(smollm2, base.layers[-1].mlp)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_the_capture_stops_on_random_decoders(family: str, tiny_model: Callable[[str], attnscope.Model]) -> None:
    m = tiny_model(family)
    base: Any = m.base
    last = base.h[-1].mlp if family == "gpt2" else base.layers[-1].mlp
    assert_stops_and_keeps(m, last)


@pytest.mark.parametrize(("family", "whole_block"), [("bert", True), ("llama", True), ("gemma3_text", True),
                                                     ("albert", False)])
def test_map_blocks_hands_over_one_layer_at_a_time(family: str, whole_block: bool,
                                                   tiny_model: Callable[[str], attnscope.Model],
                                                   minilm: attnscope.Model) -> None:
    """Each block reaches the function inside the forward pass, in layer order, before the next layer's attention
    runs; its pieces are let go once the function returns (the previous layer's weights are gone when the next
    block arrives); the blocks are those capture_blocks returns (ALBERT: one shared module for every layer)."""
    m = (attnscope.load_model(build_model(modern_configs()[family](), head="ForCausalLM"), tokenizer=minilm.tokenizer)
         if family == "gemma3_text" else tiny_model(family))  # gemma3: the sandwich norms
    whole = capture_blocks(m, inputs(m), whole_block=whole_block, dtype=torch.float32)
    attention_calls, seen = [0], []
    counter = [mod.register_forward_pre_hook(lambda *_: attention_calls.__setitem__(0, attention_calls[0] + 1))
               for mod in dict.fromkeys(layer_modules(m.model))]
    previous: list[weakref.ref[torch.Tensor]] = []

    def fn(block: LayerBlock) -> int:
        layer = len(seen)
        assert attention_calls[0] == layer + 1  # this layer's attention has run, the next one's not yet
        assert all(ref() is None for ref in previous)  # the earlier layers' weights are let go
        assert torch.equal(block.weights, whole[layer].weights) and torch.equal(block.output, whole[layer].output)
        if whole_block:
            assert block.block_output is not None and torch.equal(block.block_output, whole[layer].block_output)
        captured = block.weights._base if block.weights._base is not None else block.weights  # a view's base
        previous.append(weakref.ref(captured))
        seen.append(layer)
        return layer

    try:
        assert map_blocks(m, inputs(m), whole_block, fn, torch.float32) == list(range(m.n_layers)) == seen
    finally:
        for handle in counter:
            handle.remove()
