"""The long trace's uint8 maps (attnscope.serve.quantize, serve.maps.compact): views.payload.quantize's bytes,
formed from the forward pass's batch where it is, never from a laid-out copy."""

from __future__ import annotations

import numpy as np
import pytest

import attnscope
from attnscope.errors import AttnscopeError
from attnscope.serve import maps, memory, quantize
from attnscope.stages import DERIVED
from attnscope.views.payload import quantize as payload_quantize


def hard_maps(shape: tuple[int, ...], seed: int = 29) -> np.ndarray:
    """[map, query, key] float32 >= 0: mostly near 0, an all-zero map, a subnormal, exact .5 ties after scaling."""
    rng = np.random.default_rng(seed)
    m = (rng.random(shape, dtype=np.float32) ** 6).astype(np.float32)
    m[0] = 0  # scale 0: codes 0
    if shape[0] > 2:
        m[1].flat[0] = np.float32(1e-40)  # subnormal
        m[2] = (np.float32(0.5) / 255 * np.arange(m[2].size, dtype=np.float32).reshape(m[2].shape)) % 1  # ties
    return m


@pytest.fixture(params=["compiled", "numpy"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each map quantized by the numba kernel (quantize.compiled) or by numpy's blocks: the same bytes."""
    if request.param == "compiled":
        assert quantize.compiled() is not None  # numba is installed with every extra (make venv)
    monkeypatch.setattr(quantize, "USE_COMPILED", request.param == "compiled")
    return str(request.param)


@pytest.mark.parametrize("shape", [(4, 37, 41), (3, 130, 1100), (2, 1, 1), (3, 70, 70)])
@pytest.mark.parametrize("threads", [1, 2])
def test_codes_and_scales_are_the_payloads_byte_for_byte(shape: tuple[int, ...], threads: int, path: str) -> None:
    m = hard_maps(shape)
    codes, scales = quantize.quantize_layer("weights", 0, m, threads)
    slow_codes, slow_scales = payload_quantize(m[None])
    assert codes.tobytes() == slow_codes[0].tobytes() and np.array_equal(scales, slow_scales[0])


@pytest.mark.parametrize("threads", [1, 2])
def test_causal_maps_and_negative_zeros_are_the_payloads_byte_for_byte(threads: int, path: str) -> None:
    """A causal softmax's maps (the max exactly 1: its first query sees one key; coded without the division) and
    maps holding -0.0 (drawable; its sign bit sends the compiled kernel to the comparisons of floats)."""
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(3, 90, 90)) + np.triu(np.full((90, 90), -np.inf), 1)
    causal = np.exp(logits - logits.max(-1, keepdims=True))
    causal = (causal / causal.sum(-1, keepdims=True)).astype(np.float32)
    assert (causal.max(axis=(1, 2)) == 1).all()
    signed = hard_maps((4, 37, 41))
    signed[1:, ::3, ::2] = np.float32(-0.0)
    signed[3, 0, 0] = np.float32(-0.0)
    for m in (causal, signed):
        codes, scales = quantize.quantize_layer("weights", 0, m, threads)
        slow_codes, slow_scales = payload_quantize(m[None])
        assert codes.tobytes() == slow_codes[0].tobytes() and np.array_equal(scales, slow_scales[0])


def test_a_strided_view_is_read_where_it_is(path: str) -> None:
    batch = hard_maps((3, 50, 50))[None]  # [batch, head, query, key]; the text's part: its first 40 tokens
    view = batch[0, :, :40, :40]
    codes, _ = quantize.quantize_layer("weights", 0, view, 2)
    assert codes.tobytes() == payload_quantize(np.ascontiguousarray(view)[None])[0].tobytes()


NEGATIVE_NAN = float(np.array([0xFFC00000], dtype=np.uint32).view(np.float32)[0])  # a NaN with its sign bit set


@pytest.mark.parametrize("bad", [np.nan, NEGATIVE_NAN, np.inf, -np.inf, -1e-30, -1e-40])
def test_nan_infinity_and_negative_values_are_refused_not_patched(bad: float, path: str) -> None:
    m = hard_maps((3, 20, 20))
    m[2, 5, 7] = bad
    m[2, 0, 0] = 1  # a map whose max would be 1
    with pytest.raises(AttnscopeError, match="cannot draw 'rollout': layer 4 holds NaN, infinite or negative"):
        quantize.quantize_layer("rollout", 4, m, 2)


@pytest.mark.parametrize("shape", [(2, 2048, 2048), (3, 100, 37), (1, 5, 200), (2, 64, 64)])
def test_overview_equals_the_plain_padded_max(shape: tuple[int, ...]) -> None:
    codes = np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8)
    assert np.array_equal(quantize.overview(codes, maps.OVERVIEW), plain_overview(codes, maps.OVERVIEW))


def plain_overview(codes: np.ndarray, side: int) -> np.ndarray:
    """The overview's definition: pad to whole blocks with 0, then the max of each block."""
    nq, nk = codes.shape[-2:]
    bq, bk = -(-nq // side), -(-nk // side)  # block sizes, rounded up
    sq, sk = -(-nq // bq), -(-nk // bk)
    padded = np.zeros((*codes.shape[:-2], sq * bq, sk * bk), dtype=np.uint8)
    padded[..., :nq, :nk] = codes
    return padded.reshape(*codes.shape[:-2], sq, bq, sk, bk).max(axis=(-3, -1))


def test_compact_reads_the_batch_and_lays_nothing_out(minilm: attnscope.Model) -> None:
    text = "The old lighthouse keeper watched the storm roll in across the bay, counting waves."
    tr = attnscope.trace(text, model=minilm)
    pending = set(tr.arrays.pending())  # type: ignore[attr-defined]
    assert {"weights", "scores", "q"} <= pending
    key = (minilm.name, text, None, 256, True)
    assert not maps.is_large(tr)
    small = maps.stand_ins(tr, ["weights"], ())
    kept = maps.compact(tr, ["weights"], key)
    assert set(tr.arrays.pending()) == pending  # type: ignore[attr-defined]  # nothing copied out, nothing formed
    assert small["weights"].shape == (tr.model["layers"], tr.model["heads"], 1, 1) and small["q"].size == 0
    assert not set(small) & set(DERIVED)
    codes, scales = payload_quantize(tr.arrays["weights"])
    s = kept.sources["weights"]
    assert s.codes.tobytes() == codes.tobytes() and np.array_equal(s.scales, scales)
    assert np.array_equal(s.view, plain_overview(codes, maps.OVERVIEW))


def test_the_server_asks_numpy_for_no_huge_pages() -> None:
    """memory.tune, the server's allocator settings, has numpy ask for no transparent huge pages for the maps' codes
    (serve.memory.numpy_huge_pages); the switch answers what it was before."""
    before = memory.numpy_huge_pages(True)
    try:
        assert memory.numpy_huge_pages(True) is True
        memory.tune()
        assert memory.numpy_huge_pages(True) is False
    finally:
        memory.numpy_huge_pages(before)
