"""ALTI's distances in one pass: d_ij = ||T_i(x_j) - y_i||_1 for every key j and query i, with T_i(x_j) =
sum_h weights[h, i, j] f[h, j] + [i == j] r_i (attribution.alti.Parts), and the T's summed over the keys (the check's
sum), compiled by numba.

Why a kernel: the distances need n^2 x d_model values per layer, each a sum over the heads (inner dimension 12 on
MiniLM), and then their absolute sums. As torch calls (one batched matmul per chunk of keys into a reused buffer, then
abs and sum) every value is written to memory and read back, and a matmul with an inner dimension of 12 runs at a
fraction of its speed. Here each value is formed in a register: for one key and one query, the query's weights on the
key stay in registers (one per head, the heads' loop unrolled, its count a compile-time constant) and each f[h, j]
vector is read into the multiply-add; the value is then added to the query's row of the check's sum and its distance
from y_i to the absolute sum; nothing of size [query, key, d_model] exists. The weights of BLOCK keys are gathered
together into [key, query, head] (read along the keys, so each cache line of weights is loaded once per block rather
than once per key). MiniLM at 128 tokens: about 3 times faster than the torch calls, measured on one thread
(docs/attribution.md, Cost).

The sum: summed[i] = sum_j T_i(x_j), the very values whose distances were taken, added up in float32 key after key
(each thread its own rows, added in float64 at the end), so alti.layer_alti's check (summed_i + bias_i against the
block output captured from the model) covers what the distances read: a wrong f, weight or residual share moves it.

Rounding: float32 products and sums in an order the compiler picks (reassociation is allowed, so the sum over
d_model is vectorised); NaN and infinities are not assumed away. The tests hold the contributions to the whole
[query, key, d_model] tensor in float64 within 1e-5, and the sum to the whole tensor's within float32's rounding.

Numba is part of the `attribute` extra; without it ALTI stops with one line naming the install. The compiled code
is cached beside this module (or in numba's user-wide cache when that is read-only; with no writable place, it is
compiled once per process). Threads: the blocks of keys are dealt round-robin to torch.get_num_threads() Python
threads (the kernel releases the GIL), so a causal model's shorter late keys spread evenly; each pair is summed in
the same order whichever thread takes it (the distances' bytes do not depend on the threads; the check's sum adds
the threads' rows in another order, within its rounding).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from attnscope.errors import AttnscopeError

# keys whose weights are gathered together (MiniLM, one layer: 3.6-3.7 ms at 8, 3.7-3.8 at 16, 3.9-4.0 one by one)
BLOCK = 8
INSTALL = "pip install 'attnscope[attribute]' (or numba)"

Kernel = Callable[..., None]


def _numba() -> Any:
    try:
        import numba
    except ImportError as exc:
        raise AttnscopeError(f"ALTI's distance kernel needs numba: {INSTALL}", parameter="methods") from exc
    return numba


def _source(heads: int) -> Kernel:
    """The kernel's Python source for `heads` heads (a closure constant: numba unrolls the heads' loop)."""

    def kernel(weights: np.ndarray, f: np.ndarray, own: np.ndarray, y: np.ndarray, out: np.ndarray,
               absent: np.ndarray, summed: np.ndarray, start: int, step: int) -> None:
        # weights [head, query, key], f [head, key, d_model], own = r and y [query, d_model], out [key, query]: d_ij
        # for this thread's keys; absent [key, query]: no head weighs key j for query i != j (T_i(x_j) = 0); a key's
        # absent queries before the first that weighs it are skipped (a decoder's); summed [query, d_model] float32:
        # this thread's T_i(x_j) summed over its keys; start, step: this thread takes the blocks of BLOCK keys start,
        # start + step, ...
        n, d = y.shape
        fj = np.empty((heads, d), dtype=np.float32)  # one key's f [head, d_model], its rows read along d_model
        block = np.empty((BLOCK, n, heads), dtype=np.float32)  # a block of keys' weights [key, query, head]
        zero = np.zeros(d, dtype=np.float32)  # the residual's share of every query but the key's own
        for j0 in range(start * BLOCK, n, step * BLOCK):  # this thread's blocks of keys
            width = min(BLOCK, n - j0)
            for h in range(heads):  # read along the keys, BLOCK at a time (key by key, each load was a cache line)
                for q in range(n):
                    for b in range(width):
                        block[b, q, h] = weights[h, q, j0 + b]
            for b in range(width):
                j = j0 + b
                by_key = block[b]  # [query, head]
                fj[:] = f[:, j]
                first = j  # the first query that weighs key j (a decoder's key: itself)
                for q in range(n):
                    weighed = False
                    for h in range(heads):
                        weighed = weighed or by_key[q, h] != 0  # NaN weighs
                    absent[j, q] = not weighed and q != j
                    if weighed and q < first:
                        first = q
                # one query at a time: its weights in registers, one chain of multiply-adds per 8 values (measured
                # against two queries sharing each load of f: 15-20% faster)
                for i in range(first, n):
                    a, share, yi, row = by_key[i], own[i] if i == j else zero, y[i], summed[i]
                    s = np.float32(0.0)
                    for k in range(d):
                        t = share[k]  # the residual r_j joins at its own query
                        for h in range(heads):
                            t += a[h] * fj[h, k]
                        row[k] += t
                        s += abs(t - yi[k])
                    out[j, i] = s

    return kernel


SIGNATURE = "void(f4[:, :, ::1], f4[:, :, ::1], f4[:, ::1], f4[:, ::1], f4[:, ::1], b1[:, ::1], f4[:, ::1], i8, i8)"
FASTMATH = {"reassoc", "contract"}  # vectorised sums and fused multiply-adds; NaN and infinities kept


@functools.cache
def compiled(heads: int) -> Kernel:
    """The kernel for `heads` heads, compiled once per process (loaded from numba's cache when it has it)."""
    numba = _numba()
    options = {"nogil": True, "fastmath": FASTMATH}
    try:
        return numba.njit(SIGNATURE, cache=True, **options)(_source(heads))  # type: ignore[no-any-return]
    except RuntimeError:  # numba found no writable cache directory: compile without one
        return numba.njit(SIGNATURE, cache=False, **options)(_source(heads))  # type: ignore[no-any-return]


def distances(weights: torch.Tensor, f: torch.Tensor, diagonal: torch.Tensor,
              y: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """||T_i(x_j) - y_i||_1 [query, key] float32 on the CPU; absent [query, key]: no head weighs key j for query
    i != j, so T_i(x_j) = 0 (its distance is the caller's to set: ||y_i||_1 exactly; left 0 where skipped); and
    sum_j T_i(x_j) [query, d_model] float64, the T's the distances read, summed (alti.layer_alti checks it).
    weights [head, query, key], f [head, key, d_model], diagonal (r_i) and y [query, d_model]."""
    heads, n, d = (int(s) for s in f.shape)
    if weights.shape != (heads, n, n) or diagonal.shape != (n, d) or y.shape != (n, d):  # the kernel reads unchecked
        raise ValueError(f"ALTI's kernel: weights {tuple(weights.shape)}, f {tuple(f.shape)}, diagonal "
                         f"{tuple(diagonal.shape)} and y {tuple(y.shape)} do not fit "
                         "[head, query, key], [head, key, d_model] and [query, d_model]")
    kernel = compiled(heads)
    arrays = [t.detach().to("cpu", torch.float32).contiguous().numpy() for t in (weights, f, diagonal, y)]
    out = np.zeros((n, n), dtype=np.float32)  # [key, query]
    absent = np.zeros((n, n), dtype=np.bool_)  # [key, query]
    threads = max(1, min(torch.get_num_threads(), -(-n // BLOCK)))  # at most one per block
    summed = np.zeros((threads, n, d), dtype=np.float32)  # one per thread
    if threads == 1:
        kernel(*arrays, out, absent, summed[0], 0, 1)
    else:  # keys dealt round-robin; each thread writes its own rows of out and absent, and its own summed[t]
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda t: kernel(*arrays, out, absent, summed[t], t, threads), range(threads)))
    return out.T, absent.T, summed.sum(axis=0, dtype=np.float64)


__all__ = ["INSTALL", "compiled", "distances"]
