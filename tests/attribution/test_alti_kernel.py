"""ALTI's distance kernel (attribution.alti_kernel): its float32 distances and contributions equal the whole
[query, key, d_model] tensor in float64, and so does its sum of the T's over the keys (what the check reads); a
decoder's unseen pairs are found absent (and skipped) and nothing else; more threads give the same bytes; a kernel
that drops the residual fails the comparison; the compiled rewrite of the block (kernel_parts) equals parts(); without
numba, one line naming the install."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np
import pytest
import torch

import attnscope
from attnscope.attribution import alti_kernel
from attnscope.attribution.alti import contributions, kernel_parts, layer_alti, parts, summed_error, transformed_vectors
from attnscope.attribution.blocks import LayerBlock, capture_blocks
from attnscope.attribution.mixing import normalise_rows
from attnscope.errors import AttnscopeError
from tests.support.families import build_model, modern_configs

TEXT = ("The capital of France is Paris, and the capital of Italy is Rome; travellers between the two cities often "
        "take the night train through the Alps, which crosses the border near Modane before dawn.")


def _blocks(m: attnscope.Model, text: str = TEXT) -> list[LayerBlock]:
    return capture_blocks(m, dict(m.tokenizer(text, return_tensors="pt")), whole_block=True)  # float64


def _pieces(block: LayerBlock) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's inputs as layer_alti forms them: weights [head, query, key], f [head, key, d_model], r, y."""
    p = parts(block)
    return p.weights.float(), p.f.float(), p.diagonal.float(), p.resultant.float()


def _whole_distances(block: LayerBlock) -> torch.Tensor:
    """||T_i(x_j) - y_i||_1 [query, key] from the whole float64 tensor, y the captured output."""
    t, _ = transformed_vectors(block)  # [query, key, d_model]
    return (t - parts(block).resultant[:, None, :]).abs().sum(dim=-1)


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch (and so the kernel's thread count) on n threads inside, restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _kernel(*pieces: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's distances [query, key] in float64 and its absent pairs [query, key]."""
    d, absent, _summed = alti_kernel.distances(*pieces)
    return torch.from_numpy(d).double(), torch.from_numpy(absent)


def test_the_kernel_s_distances_equal_the_whole_float64_tensor(minilm: attnscope.Model) -> None:
    """Every pair's distance within 1e-5 of the layer's largest ||y_i||_1 (float32 against float64), and the
    contributions alti() reports within 1e-5 of the whole tensor's."""
    for block in _blocks(minilm):
        d, absent = _kernel(*_pieces(block))
        whole = _whole_distances(block)
        assert not absent.any()  # an encoder: every query weighs every key
        assert (d - whole).abs().max() <= 1e-5 * float(whole.max())  # measured 5e-08 of it
        matrix, error = layer_alti(block)
        assert np.abs(matrix - contributions(*transformed_vectors(block))).max() <= 1e-5  # measured 5.5e-07
        assert error <= 1e-5


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_the_kernel_skips_only_what_a_decoder_cannot_see(family: str,
                                                          tiny_model: Callable[[str], attnscope.Model]) -> None:
    """A causal key's earlier queries are found absent and left 0, and every other pair is computed: the seen pairs
    equal the whole tensor, and layer_alti's matrix equals the reference's with nothing above the diagonal."""
    for block in _blocks(tiny_model(family)):
        d, absent = _kernel(*_pieces(block))  # [query, key]
        whole = _whole_distances(block)
        seen = torch.ones_like(whole, dtype=torch.bool).tril()  # query i >= key j
        assert torch.equal(absent, ~seen)
        assert (d[~seen] == 0).all()
        assert (d - whole)[seen].abs().max() <= 1e-5 * float(whole.max())
        matrix, _ = layer_alti(block)
        assert np.abs(matrix - contributions(*transformed_vectors(block))).max() <= 1e-5
        assert (np.triu(matrix, k=1) == 0).all()


def test_the_kernel_sums_the_transformed_vectors_it_measures(minilm: attnscope.Model,
                                                            tiny_model: Callable[[str], attnscope.Model]) -> None:
    """The kernel's sum over the keys (what alti.layer_alti checks against the captured block output) equals the
    whole float64 tensor's, on one thread and on two, within float32's rounding of n keys (measured ~1e-7 of the
    sum's size); a decoder's skipped pairs add nothing; one key's vectors zeroed moves it by their size."""
    blocks = [_blocks(minilm)[0], _blocks(tiny_model("llama"))[0]]
    for block in blocks:
        weights, f, r, y = _pieces(block)
        t, _ = transformed_vectors(block)
        ref = t.sum(dim=1).numpy()  # [query, d_model] float64
        for threads in (1, 2):
            with torch_threads(threads):
                summed = alti_kernel.distances(weights, f, r, y)[2]
                skipped = alti_kernel.distances(weights, f.index_fill(1, torch.tensor([5]), 0.0), r, y)[2]
            assert summed.dtype == np.float64 and summed.shape == ref.shape
            assert np.abs(summed - ref).max() <= 1e-6 * max(1.0, np.abs(ref).max())
            assert np.abs(skipped - ref).max() > 1e-3 * np.abs(ref).max()


@pytest.mark.parametrize(("d_model", "causal"), [(64, False), (64, True), (36, False)])
def test_the_tiles_and_the_one_query_path_agree_with_the_whole_tensor(d_model: int, causal: bool) -> None:
    """The kernel's two paths on random pieces: d_model 64 takes the tiles (two queries at a time; 13 queries leave
    the last one and each key's own query to the one-query path), 36 (not a multiple of alti_numba.STEP) the
    one-query path alone. Distances and the sum within float32's rounding of the whole float64 tensor's."""
    g = torch.Generator().manual_seed(d_model + causal)
    heads, n = 3, 13
    scores = torch.randn(heads, n, n, generator=g)
    if causal:
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    weights, f = scores.softmax(dim=-1), torch.randn(heads, n, d_model, generator=g)
    r, y = torch.randn(n, d_model, generator=g), torch.randn(n, d_model, generator=g)
    t = torch.einsum("hqk,hkd->qkd", weights.double(), f.double())  # [query, key, d_model]
    t[torch.arange(n), torch.arange(n)] += r.double()
    whole = (t - y.double()[:, None, :]).abs().sum(dim=-1)  # [query, key]
    d, absent, summed = alti_kernel.distances(weights, f, r, y)
    seen = ~torch.from_numpy(absent)
    assert torch.equal(seen, torch.ones(n, n, dtype=torch.bool).tril() if causal else torch.ones(n, n).bool())
    assert (torch.from_numpy(d).double() - whole)[seen].abs().max() <= 1e-6 * float(whole.max())
    assert np.abs(summed - t.sum(dim=1).numpy()).max() <= 1e-6 * float(t.sum(dim=1).abs().max())
    # a per-query scale (a norm's 1 / sigma_i, alti.Parts.scale) read with the weights: the same bytes as the
    # weights scaled before (both one float32 product per weight)
    scale = torch.rand(n, generator=g) + 0.5
    scaled = alti_kernel.distances(weights * scale[None, :, None], f, r, y)
    for mine, theirs in zip(alti_kernel.distances(weights, f, r, y, scale), scaled, strict=True):
        assert np.array_equal(mine, theirs)
    assert not np.array_equal(alti_kernel.distances(weights, f, r, y, scale.flip(0))[0], scaled[0])


def test_the_finish_equals_the_steps_it_fuses(minilm: attnscope.Model,
                                              tiny_model: Callable[[str], attnscope.Model]) -> None:
    """alti_kernel.finished (one compiled pass) against the same steps in numpy and torch: ||y_i||_1, the clip at
    0, a decoder's absent pairs at 0, rows normalised (mixing.normalise_rows), and the check's error
    (alti.summed_error of the kernel's sum plus the biases); then a NaN in y stays NaN in the error and its row, and
    a row with nothing left after the clip stays 0 (not NaN, not uniform)."""
    for block in [_blocks(minilm)[1], _blocks(tiny_model("llama"))[1]]:
        weights, f, r, y = _pieces(block)
        bias = parts(block).bias.float()
        out, absent, summed = alti_kernel.run(weights, f, r, y)
        matrix, error = alti_kernel.finished(out, absent, summed, y, bias)
        norm = y.double().abs().sum(dim=-1, keepdim=True).numpy()  # [query, 1]
        steps = normalise_rows(np.where(absent.T, 0.0, np.maximum(norm - out.T, 0.0)))
        assert np.abs(matrix - steps).max() <= 1e-12
        whole = summed_error(replace(block, block_output=y.double()),
                             torch.from_numpy(summed.sum(axis=0, dtype=np.float64)) + bias.double())
        assert abs(error - whole) <= 1e-12 and error <= 1e-5
        broken = y.clone()
        broken[3, 7] = float("nan")
        matrix, error = alti_kernel.finished(out, absent, summed, broken, bias)
        assert np.isnan(error) and np.isnan(matrix[3]).all() and not np.isnan(np.delete(matrix, 3, axis=0)).any()
        far = out.copy()
        far[:, 5] = 1e30  # every key of query 5 farther from y_5 than the origin: the clip leaves nothing
        matrix, _ = alti_kernel.finished(far, absent, summed, y, bias)
        assert (matrix[5] == 0).all()


def test_more_threads_give_the_same_bytes(minilm: attnscope.Model) -> None:
    """Each pair is summed in the same order whichever thread takes its key."""
    pieces = _pieces(_blocks(minilm)[0])
    with torch_threads(1):
        one = _kernel(*pieces)
    with torch_threads(2):
        two = _kernel(*pieces)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


def test_a_kernel_without_the_residual_fails_the_comparison(minilm: attnscope.Model) -> None:
    """The comparison above can fail: dropping r_i (the residual's share at i == j) moves the distances and the
    contributions far past 1e-5."""
    block = _blocks(minilm)[0]
    weights, f, r, y = _pieces(block)
    wrong, _ = _kernel(weights, f, torch.zeros_like(r), y)
    assert (wrong - _whole_distances(block)).abs().max() > 1e-2 * float(_whole_distances(block).max())


def test_without_numba_alti_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "numba", None)  # `import numba` raises ImportError, as when it is absent
    with pytest.raises(AttnscopeError, match=r"pip install 'attnscope\[attribute\]'") as err:
        alti_kernel.compiled.__wrapped__(3)
    assert "\n" not in str(err.value) and err.value.parameter == "methods"


def test_the_compiled_rewrite_equals_parts(minilm: attnscope.Model) -> None:
    """alti.kernel_parts (the norm's rewrite in one compiled pass, what layer_alti runs) against parts() in float64:
    a post-norm LayerNorm (MiniLM, every layer) and a sandwich RMSNorm (a random Gemma 3): W', the diagonal, the bias,
    the per-query scale and so the scaled weights, each within float32's rounding of its size; a rewrite that
    forgets the centring or the scale is far off."""
    gemma = attnscope.load_model(build_model(modern_configs()["gemma3_text"](), head="ForCausalLM"),
                                 tokenizer=minilm.tokenizer)
    for block in _blocks(minilm) + _blocks(gemma):
        assert block.norm is not None
        want, got = parts(block), kernel_parts(block)
        assert got.w.dtype == torch.float32 and got.scale is not None and want.scale is not None
        for name, a, b in [("w", want.w, got.w), ("diagonal", want.diagonal, got.diagonal),
                           ("bias", want.bias, got.bias), ("scale", want.scale, got.scale),
                           ("weights", want.weights, got.weights)]:
            assert a.shape == b.shape, name
            assert (a - b.double()).abs().max() <= 2**-22 * max(1.0, float(a.abs().max())), name
        assert (want.w - (block.w_o * block.norm.gamma)).abs().max() > 1e-3 or not block.norm.centred
        assert (want.weights - block.weights).abs().max() > 1e-3
