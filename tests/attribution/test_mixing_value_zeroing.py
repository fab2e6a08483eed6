"""Value zeroing (attribution.value_zeroing): through the registered attention function, bit for bit when nothing is
zeroed, and equal to zeroing the value projection's output directly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import attnscope
from attnscope.attribution.mixing import normalise_rows
from attnscope.attribution.value_zeroing import (
    ValueZeroing,
    _hidden,
    _mixing,
    cosine_distance,
    layer_modules_of,
    layer_outputs,
    unchanged_error,
    value_zeroing,
    zeroed_output,
)
from attnscope.capture import intervening
from attnscope.errors import AttnscopeError
from attnscope.families import attention_modules
from tests.support.families import build_model, modern_configs

TEXT = "The capital of France is Paris."


def inputs(m: attnscope.Model, text: str = TEXT) -> dict[str, torch.Tensor]:
    return dict(m.tokenizer(text, return_tensors="pt"))


def by_value_projection(m: attnscope.Model, x: dict[str, torch.Tensor], layers: tuple[int, ...]) -> np.ndarray:
    """The definition done another way: a hook zeroes token j's row of layer l's value projection output (BERT's
    `value`, Llama's `v_proj`), the untouched model runs, layer l's output is compared. [layer, query, key], zero
    outside `layers`"""
    plain, n = layer_outputs(m, x), x["input_ids"].shape[1]
    scores = np.zeros((len(plain), n, n))
    for layer in layers:
        module = attention_modules(m.model)[layer]
        proj = getattr(module, "value", None) or module.v_proj
        for j in range(n):
            def zero(_mod: Any, _args: Any, out: torch.Tensor, j: int = j) -> torch.Tensor:
                out = out.clone()
                out[:, j] = 0.0
                return out

            handle = proj.register_forward_hook(zero)
            try:
                zeroed = layer_outputs(m, x)
            finally:
                handle.remove()
            scores[layer, :, j] = cosine_distance(plain[layer][0], zeroed[layer][0])
    return normalise_rows(scores)


def test_value_zeroing_on_minilm_equals_zeroing_the_value_projection(minilm: attnscope.Model) -> None:
    r = value_zeroing(minilm, inputs(minilm))
    assert r.method == "value_zeroing" and r.verified is True and r.bound == 0.0
    n = inputs(minilm)["input_ids"].shape[1]
    assert (r.max_error == 0.0).all() and r.forwards == n + 3 and f"{minilm.n_layers} zeroing calls" in r.detail
    assert np.allclose(r.matrices.sum(-1), 1.0, atol=1e-12) and (r.matrices >= 0).all()
    layers = (0, 5)  # the first and the last: each zeroing costs a forward pass here
    expected = by_value_projection(minilm, inputs(minilm), layers)[list(layers)]
    assert np.abs(r.matrices[list(layers)] - expected).max() <= 1e-4


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_value_zeroing_on_random_weights_equals_the_definition(
        family: str, tiny_model: Callable[[str], attnscope.Model]) -> None:
    m = tiny_model(family)
    r = value_zeroing(m, inputs(m))
    assert r.verified is True and np.abs(r.matrices - by_value_projection(m, inputs(m), (0, 1))).max() <= 1e-4
    if family == "llama":  # zeroing a later token changes no earlier position: exactly 0
        assert (np.triu(r.matrices, k=1) == 0).all()


def test_value_zeroing_on_gpt2_batches_and_checks(tiny_model: Callable[[str], attnscope.Model]) -> None:
    m = tiny_model("gpt2")
    n = inputs(m)["input_ids"].shape[1]
    small = value_zeroing(m, inputs(m), max_batch_tokens=3 * n)  # 2 zeroed rows a call
    whole = value_zeroing(m, inputs(m))
    assert small.verified is True and f"{m.n_layers * -(-n // 2)} zeroing calls" in small.detail
    assert np.abs(small.matrices - whole.matrices).max() <= 1e-6
    assert (np.triu(whole.matrices, k=1) == 0).all()


def test_value_zeroing_on_smollm2(smollm2: attnscope.Model) -> None:
    r = value_zeroing(smollm2, inputs(smollm2, "The capital of France is"))
    assert r.verified is True and (r.max_error == 0.0).all() and r.matrices.shape[0] == smollm2.n_layers
    assert np.allclose(r.matrices.sum(-1), 1.0, atol=1e-12) and (np.triu(r.matrices, k=1) == 0).all()


def test_an_intervention_that_changes_anything_fails_the_bit_for_bit_check(minilm: attnscope.Model) -> None:
    x = inputs(minilm)
    plain = layer_outputs(minilm, x)
    errors, cap, _ = unchanged_error(minilm, x, plain, ValueZeroing([(-1, -1)], [], []))
    assert (errors == 0.0).all()
    weights = [c.weights[0] for c in cap.calls]
    v = [c.v[0] for c in cap.calls]
    # token 3's value zeroed in layer 2 of a pass that should change nothing: layers 0-1 equal, 2 on differ
    wrong, _, _ = unchanged_error(minilm, x, plain, ValueZeroing([(2, 3)], weights, v))
    assert (wrong[:2] == 0.0).all() and (wrong[2:] > 0.0).all()
    # a last-bit change of the context is caught too: the check is bit for bit, not within a tolerance
    nudged = ValueZeroing([(0, 3)], weights, [t * 2.0**-16 for t in v])
    assert (unchanged_error(minilm, x, plain, nudged)[0] > 0.0).any()


def test_value_zeroing_on_gemma2_equals_the_definition(minilm: attnscope.Model) -> None:
    """Sliding windows, soft-capping and grouped k/v heads: the zeroing still happens inside the real attention."""
    m = attnscope.load_model(build_model(modern_configs()["gemma2"](), head="ForCausalLM"), tokenizer=minilm.tokenizer)
    r = value_zeroing(m, inputs(m))
    assert r.verified is True and np.abs(r.matrices - by_value_projection(m, inputs(m), (0, 1))).max() <= 1e-4


def test_encoder_decoders_and_shared_layers_are_refused_in_one_line(
        seq2seq: Callable[[str], attnscope.Model], tiny_model: Callable[[str], attnscope.Model]) -> None:
    for m, says in ((seq2seq("bart"), "encoder-decoder"), (tiny_model("albert"), "shared module")):
        with pytest.raises(AttnscopeError, match=says) as err:
            value_zeroing(m, inputs(m))
        assert "\n" not in str(err.value) and err.value.parameter == "methods"


def test_a_layer_call_that_bypasses_the_registered_function_fails_the_check(minilm: attnscope.Model) -> None:
    """The zeroing happens only where the layer's attention calls the registered function: the intervention counts
    those calls, and value zeroing's check fails (NOT equal, NaN errors) when a call did not reach it."""
    x = inputs(minilm)
    plain = layer_outputs(minilm, x)
    _, cap, calls = unchanged_error(minilm, x, plain, ValueZeroing([(-1, -1)], [], []))
    weights, v = [c.weights[0] for c in cap.calls], [c.v[0] for c in cap.calls]
    module = layer_modules_of(minilm.model)[1]
    through = ValueZeroing([(-1, -1), (1, 2)], weights, v, first=1)
    out = zeroed_output(minilm, module, calls[1], through)
    assert through.calls == 1 and cosine_distance(out[0], out[1]).max() > 1e-6  # it ran, and it changed the output
    bypass = ValueZeroing([(-1, -1), (1, 2)], weights, v, first=1)
    with torch.no_grad(), intervening(minilm.model, bypass):  # installed, but attention routed around the registry
        minilm.model.set_attn_implementation("eager")  # (intervening restores the implementation it found)
        args, kwargs = calls[1].widened(2)
        bypassed = _hidden(module(*args, **kwargs))
    assert bypass.calls == 0 and cosine_distance(bypassed[0], bypassed[1]).max() == 0.0  # nothing was zeroed
    r = _mixing(np.zeros((6, 3, 3)), np.zeros(6), calls_ok=False, forwards=2, layer_runs=6)
    assert r.verified is False and np.isnan(r.max_error).all() and "NO, nothing was zeroed" in r.detail
