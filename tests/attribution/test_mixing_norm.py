"""Norm-based attention per layer (attribution.norm_based): its vectors add up to the real attention output."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
import torch

import attnscope
from attnscope.attribution.blocks import capture_blocks
from attnscope.attribution.norm_based import layer_norms, norm_based, output_error
from attnscope.errors import AttnscopeError
from attnscope.norms import norm_attention_batch
from tests.support.families import build_model, modern_configs

TEXT = "The capital of France is Paris, a city of light."


def inputs(m: attnscope.Model, text: str = TEXT) -> dict[str, torch.Tensor]:
    return dict(m.tokenizer(text, return_tensors="pt"))


def check(m: attnscope.Model, causal: bool, text: str = TEXT) -> None:
    r = norm_based(m, inputs(m, text))
    assert r.method == "norm" and r.verified is True and r.forwards == 1 and r.bound == 1e-5
    assert r.matrices.shape[0] == m.n_layers and float(r.max_error.max()) <= 1e-5
    assert np.allclose(r.matrices.sum(axis=-1), 1.0, atol=1e-12) and (r.matrices >= 0).all()
    if causal:
        assert (np.triu(r.matrices, k=1) == 0).all()
    for block in capture_blocks(m, inputs(m, text), whole_block=False)[:2]:  # attnscope.norms = the vectors' norms
        assert torch.allclose(layer_norms(block), block.attention_vectors().norm(dim=-1), rtol=0, atol=1e-9)


def test_norm_based_adds_up_on_minilm(minilm: attnscope.Model) -> None:
    check(minilm, causal=False)


def test_norm_based_adds_up_on_smollm2(smollm2: attnscope.Model) -> None:
    check(smollm2, causal=True, text="The capital of France is")


@pytest.mark.parametrize("family", ["bert", "distilbert", "gpt2", "llama"])
def test_norm_based_adds_up_on_random_weights(family: str, tiny_model: Callable[[str], attnscope.Model]) -> None:
    check(tiny_model(family), causal=family in ("gpt2", "llama"))


@pytest.mark.parametrize("family", ["gemma2", "qwen3", "gpt_oss"])
def test_norm_based_adds_up_on_modern_random_weights(family: str, minilm: attnscope.Model) -> None:
    """Soft-capping and windows, QK-norm, attention sinks (weights that sum to less than 1): still additive."""
    model = build_model(modern_configs()[family](), head="ForCausalLM")
    check(attnscope.load_model(model, tokenizer=minilm.tokenizer), causal=True)


def test_a_missing_bias_or_head_or_wrong_split_fails_the_check(minilm: attnscope.Model) -> None:
    for block in capture_blocks(minilm, inputs(minilm), whole_block=False)[:2]:
        assert output_error(block, block.attention_sum()) <= 1e-5
        assert torch.allclose(block.attention_sum(), block.attention_vectors().sum(dim=1), rtol=0, atol=1e-9)
        no_bias = dataclasses.replace(block, b_o=torch.zeros_like(block.b_o))
        assert output_error(no_bias, block.attention_sum()) > 1e-3
        one_head_less = torch.einsum("hqk,hkd->qd", block.weights[:-1], block.f[:-1])
        assert output_error(block, one_head_less) > 1e-3
        heads, _, d_head = block.v.shape  # W_O's rows read as [d_head, head] instead of [head, d_head]
        crossed = block.w_o.reshape(d_head, heads, -1).transpose(0, 1).reshape(heads * d_head, -1)
        assert output_error(block, dataclasses.replace(block, w_o=crossed).attention_sum()) > 1e-3


def test_an_encoder_decoder_is_refused_in_one_line(seq2seq: Callable[[str], attnscope.Model]) -> None:
    m = seq2seq("t5")
    with pytest.raises(AttnscopeError, match="encoder-decoder") as err:
        norm_based(m, inputs(m))
    assert "\n" not in str(err.value)


def test_the_float32_norms_equal_attnscope_norms_in_float64_on_minilm(minilm: attnscope.Model) -> None:
    assert_float32_norms(minilm)


def test_the_float32_norms_equal_attnscope_norms_in_float64_on_smollm2(smollm2: attnscope.Model) -> None:
    assert_float32_norms(smollm2)


def assert_float32_norms(m: attnscope.Model) -> None:
    """norm_based() takes float32 blocks (the captured precision): its norms equal attnscope.norms' float64 ones
    within 1e-5 of each row's largest, and a wrong Gram (the heads' cross terms dropped) does not."""
    wide = capture_blocks(m, inputs(m), whole_block=False)
    for layer, block in enumerate(capture_blocks(m, inputs(m), whole_block=False, dtype=torch.float32)):
        ours = layer_norms(block).double()
        theirs = norm_attention_batch(wide[layer].v[None, None], wide[layer].weights[None, None],
                                      [wide[layer].w_o])["norm_layer"][0, 0]
        scale = theirs.max(dim=-1, keepdim=True).values
        assert ((ours - theirs).abs() / scale).max() <= 1e-5
        no_cross = (block.weights**2 * (block.f**2).sum(-1)[:, None, :]).sum(0).sqrt()  # sum_h ||a_h f_h||^2 only
        assert ((no_cross.double() - theirs).abs() / scale).max() > 1e-3
