"""ALTI (attribution.alti): the decomposition adds up to the real block output, and equals the authors' code."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import attnscope
from attnscope.attribution import alti_kernel
from attnscope.attribution.alti import (
    alti,
    block_error,
    contributions,
    layer_alti,
    parts,
    transformed_vectors,
)
from attnscope.attribution.blocks import LayerBlock, capture_blocks
from attnscope.attribution.mixing import LayerMixing
from attnscope.errors import AttnscopeError
from tests.support.families import build_model, modern_configs

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "alti-reference" / "minilm.npz"
TEXT = "The capital of France is Paris, a city of light."


def inputs(m: attnscope.Model, text: str = TEXT) -> dict[str, torch.Tensor]:
    return dict(m.tokenizer(text, return_tensors="pt"))


def assert_mixing(r: LayerMixing, m: attnscope.Model, causal: bool) -> None:
    assert r.method == "alti" and r.verified is True and r.forwards == 1
    assert r.matrices.shape[0] == m.n_layers and r.max_error.shape == (m.n_layers,)
    assert float(r.max_error.max()) <= r.bound == 1e-5
    assert np.allclose(r.matrices.sum(axis=-1), 1.0, atol=1e-12) and (r.matrices >= 0).all()
    if causal:  # a decoder's position i takes nothing from a later position
        assert (np.triu(r.matrices, k=1) == 0).all()
    assert np.allclose(r.rolled().sum(axis=-1), 1.0, atol=1e-12)


def test_alti_equals_the_authors_reference_on_minilm(minilm: attnscope.Model) -> None:
    ref = np.load(REFERENCE)
    ids = torch.tensor(ref["input_ids"])[None]
    r = alti(minilm, {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    assert r.matrices.shape == ref["contributions"].shape
    assert np.abs(r.matrices - ref["contributions"]).max() <= 1e-4  # measured 3.4e-05
    assert np.abs(r.rolled() - ref["rolled"][-1]).max() <= 1e-4


def test_the_decomposition_equals_the_authors_resultants_and_distances(minilm: attnscope.Model) -> None:
    """Before normalising: y_i (the transformed vectors' sum plus biases) and ||y_i - T_i(x_j)||_1 per layer."""
    ref = np.load(REFERENCE)
    ids = torch.tensor(ref["input_ids"])[None]
    for layer, block in enumerate(capture_blocks(minilm, {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                                                 True)):
        t, bias = transformed_vectors(block)
        y = t.sum(dim=1) + bias
        assert (y - torch.from_numpy(ref["resultants"][layer]).double()).abs().max() <= 1e-5  # measured 6.5e-06
        distance = torch.cdist(y[:, None, :], t, p=1)[:, 0]  # measured 2.1e-04: theirs adds 1e-6 to 384 components
        assert (distance - torch.from_numpy(ref["distances"][layer]).double()).abs().max() <= 1e-3


def test_a_wrong_distance_differs_from_the_reference(minilm: attnscope.Model) -> None:
    """The comparison can fail: L2 distances instead of the paper's L1 are far from the authors' matrices."""
    ref = np.load(REFERENCE)
    ids = torch.tensor(ref["input_ids"])[None]
    block = capture_blocks(minilm, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, True)[0]
    t, bias = transformed_vectors(block)
    y = t.sum(dim=1) + bias
    l2 = (y.norm(dim=-1, keepdim=True) - (y[:, None] - t).norm(dim=-1)).clamp(min=0).numpy()
    assert np.abs(l2 / l2.sum(-1, keepdims=True) - ref["contributions"][0]).max() > 1e-2
    assert np.abs(contributions(t, bias) - ref["contributions"][0]).max() <= 1e-4


def test_alti_adds_up_on_minilm(minilm: attnscope.Model) -> None:
    r = alti(minilm, inputs(minilm))
    assert_mixing(r, minilm, causal=False)
    assert "LayerNorm output" in r.detail


def test_alti_adds_up_on_smollm2(smollm2: attnscope.Model) -> None:
    r = alti(smollm2, inputs(smollm2, "The capital of France is"))
    assert_mixing(r, smollm2, causal=True)
    assert "residual + attention output" in r.detail


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert", "gpt2", "llama"])
def test_alti_adds_up_on_random_weights(family: str, tiny_model: Callable[[str], attnscope.Model]) -> None:
    m = tiny_model(family)
    assert_mixing(alti(m, inputs(m)), m, causal=family in ("gpt2", "llama"))


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text"])
def test_alti_adds_up_on_random_sandwich_norm_models(family: str, minilm: attnscope.Model) -> None:
    m = attnscope.load_model(build_model(modern_configs()[family](), head="ForCausalLM"), tokenizer=minilm.tokenizer)
    r = alti(m, inputs(m))
    assert_mixing(r, m, causal=True)
    assert "residual + RMSNorm(attention output)" in r.detail
    for block in _blocks(m):  # the residual inside the norm, or the norm scaling by w and not 1 + w, fails
        assert block.norm is not None
        assert block_error(block, *transformed_vectors(dataclasses.replace(block, norm=dataclasses.replace(
            block.norm, sandwich=False)))) > 1e-3
        assert block_error(block, *transformed_vectors(dataclasses.replace(block, norm=dataclasses.replace(
            block.norm, gamma=block.norm.gamma - 1.0)))) > 1e-3


def test_alti_adds_up_on_gemma3(gemma3: attnscope.Model) -> None:
    r = alti(gemma3, inputs(gemma3, "The capital of France is"))
    assert_mixing(r, gemma3, causal=True)


def _blocks(m: attnscope.Model) -> list[LayerBlock]:
    return capture_blocks(m, inputs(m), whole_block=True)


def assert_a_dropped_residual_fails(m: attnscope.Model) -> None:
    for block in _blocks(m)[:2]:
        assert block.residual is not None
        wrong = dataclasses.replace(block, residual=torch.zeros_like(block.residual))
        assert block_error(block, *transformed_vectors(block)) <= 1e-5
        assert block_error(block, *transformed_vectors(wrong)) > 1e-3


def test_a_dropped_residual_fails_the_check_on_minilm(minilm: attnscope.Model) -> None:
    assert_a_dropped_residual_fails(minilm)


def test_a_dropped_residual_fails_the_check_on_smollm2(smollm2: attnscope.Model) -> None:
    assert_a_dropped_residual_fails(smollm2)


def test_a_wrong_layernorm_statistic_fails_the_check(minilm: attnscope.Model) -> None:
    """sigma_i from each source's own share instead of the full sum (LayerNorm taken per source) does not add
    up to the real output; nor does a variance without centring."""
    for block in _blocks(minilm)[:2]:
        assert block.residual is not None and block.norm is not None
        n = block.norm
        z = block.attention_vectors() + torch.diag_embed(block.residual.T).permute(1, 2, 0)
        centred = z - z.mean(-1, keepdim=True)
        per_source = n.gamma * centred / torch.sqrt(z.var(-1, unbiased=False, keepdim=True) + n.eps)
        full = z.sum(1) + block.b_o
        uncentred = torch.sqrt((full**2).mean(-1) + n.eps)[:, None, None]  # RMS, not the standard deviation
        bias = (block.b_o - block.b_o.mean()) * n.gamma / uncentred[:, 0] + n.beta
        assert block_error(block, per_source, n.beta.expand(z.shape[0], -1)) > 1e-2
        assert block_error(block, n.gamma * centred / uncentred, bias) > 1e-4


def test_families_alti_cannot_decompose_are_refused_in_one_line(
        tiny_model: Callable[[str], attnscope.Model], seq2seq: Callable[[str], attnscope.Model]) -> None:
    for m, says in ((seq2seq("bart"), "encoder-decoder"), (tiny_model("albert"), "places its norms"),
                    (tiny_model("starcoder2"), "adapter")):
        with pytest.raises(AttnscopeError, match=says) as err:
            alti(m, inputs(m))
        assert "\n" not in str(err.value) and err.value.parameter == "methods"


def test_a_batch_or_padding_is_refused(minilm: attnscope.Model) -> None:
    batch = dict(minilm.tokenizer([TEXT, "Short."], return_tensors="pt", padding=True))
    with pytest.raises(AttnscopeError, match="one text at a time"):
        alti(minilm, batch)
    one = inputs(minilm)
    one["attention_mask"][0, -1] = 0
    with pytest.raises(AttnscopeError, match="unpadded"):
        alti(minilm, one)


def test_alti_s_own_check_fails_on_a_wrong_block(minilm: attnscope.Model, smollm2: attnscope.Model) -> None:
    """layer_alti's check (the one alti() reports) is not the reference path's: a dropped residual, a LayerNorm
    scale of w - 1 or a swapped W_O fails it."""
    for m in (minilm, smollm2):
        for block in _blocks(m)[:2]:
            assert block.residual is not None
            assert layer_alti(block)[1] <= 1e-5
            assert layer_alti(dataclasses.replace(block, residual=torch.zeros_like(block.residual)))[1] > 1e-3
            assert layer_alti(dataclasses.replace(block, w_o=block.w_o.flip(0)))[1] > 1e-3
            if block.norm is not None:
                wrong = dataclasses.replace(block.norm, gamma=block.norm.gamma - 1.0)
                assert layer_alti(dataclasses.replace(block, norm=wrong))[1] > 1e-3


def test_the_check_fails_on_a_wrong_f(minilm: attnscope.Model, smollm2: attnscope.Model) -> None:
    """The check reads the kernel's own sum of the T's it measured, so the head vectors f [head, key, d_model] it was
    given are checked too: f as layer_alti forms it passes; one head's vectors formed with the next head's W', or
    f with its keys' vectors permuted along d_model, fail."""
    for m in (minilm, smollm2):
        for block in _blocks(m)[:2]:
            p = parts(block)
            v, w = p.v.float(), p.w.float()
            heads, d_head = v.shape[0], v.shape[-1]
            f = torch.bmm(v, w.view(heads, d_head, -1))  # as layer_alti forms it
            assert _kernel_check(block, f) <= 1e-5
            assert _kernel_check(block, torch.bmm(v, w.view(heads, d_head, -1).roll(1, dims=0))) > 1e-3  # another W'
            assert _kernel_check(block, f.flip(-1).contiguous()) > 1e-3


def _kernel_check(block: LayerBlock, f: torch.Tensor) -> float:
    """layer_alti's check with these head vectors given to the kernel: the error of its sum of the T's."""
    p = parts(block)
    return alti_kernel.layer(p.weights.float(), f, p.diagonal.float(), p.resultant.float(), p.bias.float())[1]
