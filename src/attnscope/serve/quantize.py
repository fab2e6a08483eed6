"""A long trace's maps as uint8 codes, one layer at a time, in cache-sized blocks on a few threads.

The codes are views.payload.quantize's byte for byte (code = rint(float64(value) / scale * 255), scale the map's
max, read as 1 where it is 0; values first rounded to float32, as serve.binary.quantize_maps reads them): the
same numpy operations in the same dtype, each correctly rounded (IEEE 754 division and product, rint to even),
so the result cannot depend on how the work is split. What changes is where it runs: a block of 2^17 float64
values (1 MiB) stays in a core's cache through its steps, where a whole map's pass per step went to memory and
back (SmolLM2 at 2,048 tokens, one 2,048 x 2,048 map: ~8 ms instead of 60-150 ms), and the maps of a layer are
shared among `threads` workers (numpy releases the GIL in each step). tests/serve/test_serve_quantize.py compares.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from attnscope.errors import AttnscopeError

BLOCK = 2**17  # float64 values per block: 1 MiB of scratch, a core's L2


def quantize_layer(name: str, layer: int, maps: np.ndarray, threads: int = 1,
                   out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One layer's maps [map, query, key] (>= 0, finite; a view into a batch is read where it is) -> uint8
    codes [map, query, key] (written into out when given) and scales [map] float64 (each map's max). A layer with
    NaN, an infinity or a value below 0 is refused: views draw finite maps >= 0 (never patched)."""
    codes = np.empty(maps.shape, dtype=np.uint8) if out is None else out
    scales = np.zeros(maps.shape[0])  # [map]
    drawable = np.ones(maps.shape[0], dtype=bool)
    kernel = compiled() if USE_COMPILED else None  # here, before the threads: numba is imported and loaded once

    def one(i: int) -> None:
        drawable[i] = _quantize_map(np.asarray(maps[i], dtype="<f4"), codes[i], scales, i, kernel)

    if threads > 1 and maps.shape[0] > 1:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(maps.shape[0])))
    else:
        for i in range(maps.shape[0]):
            one(i)
    if not drawable.all():
        raise AttnscopeError(f"cannot draw {name!r}: layer {layer} holds NaN, infinite or negative values; "
                             "views need finite values >= 0")
    return codes, scales


def _quantize_map(m: np.ndarray, out: np.ndarray, scales: np.ndarray, i: int,
                  kernel: Callable[[np.ndarray, np.ndarray, np.ndarray], float] | None) -> bool:
    """One [query, key] float32 map into out (uint8) and scales[i]; False (nothing written) where it is not
    drawable: NaN fails both comparisons, an infinity or a value below 0 one. By the compiled kernel where given
    (`compiled`: numba installed), in numpy's blocks otherwise: the same bytes."""
    if not m.size:
        return True
    if kernel is not None:
        scale = kernel(m, m.view("<i4"), out)
        if scale < 0:
            return False
        scales[i] = scale
        return True
    step = max(1, BLOCK // m.shape[-1])  # query rows per block
    starts = range(0, m.shape[0], step)
    # each block's max, then its min from the cache: one pass over the map in memory (NaN propagates in both)
    ends = np.array([(m[s:s + step].max(), m[s:s + step].min()) for s in starts])  # [block, 2] float32
    high, low = ends[:, 0].max(), ends[:, 1].min()
    if not (low >= 0 and high < np.inf):
        return False
    scales[i] = high
    divisor = scales[i] if scales[i] > 0 else 1.0
    scratch = np.empty((min(step, m.shape[0]), m.shape[-1]))  # [query, key] float64
    for start in starts:
        block = scratch[:min(step, m.shape[0] - start)]
        np.divide(m[start:start + step], divisor, out=block)  # float32 -> float64, then divided
        np.multiply(block, 255.0, out=block)
        np.rint(block, out=block)
        out[start:start + step] = block  # exact integers 0..255: the cast is exact
    return True


USE_COMPILED = True  # tests switch it off to hold the two paths to the same bytes


@functools.cache
def compiled() -> Callable[[np.ndarray, np.ndarray, np.ndarray], float] | None:
    """`codes_of` compiled by numba (cached on disk where numba finds a writable place), or None without numba.
    A layer's 9 causal maps of 2,048 x 2,048 (SmolLM2's shape; the max 1) on 2 threads: ~25 ms (~31 ms with another
    max, which divides) against ~66 ms for numpy's blocks, which pass over each block four times (divide, multiply,
    round, cast) where the compiled loop passes once; ~55 ms for this kernel when it compared floats for the max
    and always divided (stop 44, one machine and hour: `codes_of`)."""
    try:
        import numba
    except ImportError:
        return None
    signatures = [numba.float64(numba.float32[:, ::1], numba.int32[:, ::1], numba.uint8[:, ::1]),
                  numba.float64(numba.float32[:, :], numba.int32[:, :], numba.uint8[:, :])]  # contiguous, strided
    try:
        return numba.njit(signatures, cache=True, nogil=True)(codes_of)  # type: ignore[no-any-return]
    except RuntimeError:  # numba found no writable cache directory: compile without one
        return numba.njit(signatures, cache=False, nogil=True)(codes_of)  # type: ignore[no-any-return]


def codes_of(m: np.ndarray, bits: np.ndarray, out: np.ndarray) -> float:
    """One non-empty [query, key] float32 map's codes into out (uint8 [query, key]): returns its scale (the max), or
    -1 where it holds NaN, an infinity or a value below 0 (out then unspecified). bits: the same map read as int32.
    Each code is numpy's, one value at a time: rint(float64(value) / scale * 255) with the scale read as 1 where it
    is 0, each step correctly rounded in float64 (no fast-math), rint to even; the result is an exact integer
    0..255, so the cast is exact.

    The scale from the bits: a float32 whose sign bit is clear orders as its bits do, as an int32, from +0 up to
    +infinity (0x7f800000) and then NaN; integer max and min vectorise where a float comparison, ordered around
    NaN, does not. A sign bit set (a value below 0, a NaN with its sign set, or -0.0, which is drawable) sends the
    map to the comparisons of floats. A map whose max is 1 (a causal map's: its first query sees one key) is
    coded without the division, which by 1 is exact."""
    high_bits, low_bits = np.int32(0), np.int32(0x7fffffff)
    for i in range(bits.shape[0]):
        for j in range(bits.shape[1]):
            high_bits = max(high_bits, bits[i, j])
            low_bits = min(low_bits, bits[i, j])
    if low_bits < 0:
        high, low, nan = np.float32(-np.inf), np.float32(np.inf), False
        for i in range(m.shape[0]):
            for j in range(m.shape[1]):
                v = m[i, j]
                if v > high:
                    high = v
                if v < low:
                    low = v
                if v != v:
                    nan = True
        if nan or not (low >= 0 and high < np.inf):
            return -1.0
    elif high_bits >= 0x7f800000:  # +infinity, or NaN
        return -1.0
    else:
        high = np.full(1, high_bits, dtype=np.int32).view(np.float32)[0]  # those bits read as the float they are
    if high == 1:
        for i in range(m.shape[0]):
            for j in range(m.shape[1]):
                out[i, j] = np.uint8(np.rint(np.float64(m[i, j]) * 255.0))
        return 1.0
    divisor = np.float64(high) if high > 0 else 1.0
    for i in range(m.shape[0]):
        for j in range(m.shape[1]):
            out[i, j] = np.uint8(np.rint(np.float64(m[i, j]) / divisor * 255.0))
    return float(high)


def overview(codes: np.ndarray, side: int) -> np.ndarray:
    """[..., query, key] codes -> [..., s_q, s_k] with each cell the max over its block (s <= side; blocks past the
    edge padded with 0); along the queries first (an elementwise max of whole rows, which numpy vectorises: 8-12 ms a
    SmolLM2 layer at 2,048 tokens against 97-150 ms keys first), then along the keys of bq times fewer numbers, and
    no padded copy where the blocks fit (tests/serve/test_serve_quantize.py compares it with the plain padded max)."""
    nq, nk = codes.shape[-2:]
    bq, bk = -(-nq // side), -(-nk // side)  # block sizes, rounded up
    sq, sk = -(-nq // bq), -(-nk // bk)
    if (sq * bq, sk * bk) != (nq, nk):
        padded = np.zeros((*codes.shape[:-2], sq * bq, sk * bk), dtype=np.uint8)
        padded[..., :nq, :nk] = codes
        codes = padded
    by_query = codes.reshape(*codes.shape[:-2], sq, bq, sk * bk).max(axis=-2)  # [..., s_q, key]
    pooled: np.ndarray = by_query.reshape(*codes.shape[:-2], sq, sk, bk).max(axis=-1)  # [..., s_q, s_k]
    return pooled
