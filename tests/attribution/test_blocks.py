"""attribution.blocks: the capture stops after the last layer's attention block, and what it keeps is the full
forward pass's own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import attnscope
from attnscope.attribution.blocks import capture_blocks
from attnscope.capture import capturing

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
