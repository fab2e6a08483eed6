"""ALTI's distances in one pass: d_ij = ||T_i(x_j) - y_i||_1 for every key j and query i, with T_i(x_j) =
s_i sum_h weights[h, i, j] f[h, j] + [i == j] r_i (attribution.alti.Parts; s_i a norm's per-query scale, 1 where
there is none), and the T's summed over the keys (the check's sum), compiled by numba.

Why a kernel: the distances need n^2 x d_model values per layer, each a sum over the heads (inner dimension 12 on
MiniLM), and then their absolute sums. As torch calls (one batched matmul per chunk of keys into a reused buffer,
then abs and sum) every value is written to memory and read back, and a matmul with an inner dimension of 12 runs at
a fraction of its speed. Here each value is formed in a register and nothing of size [query, key, d_model] exists:
for one key, two queries at a time (alti_numba's tile, vector code written as LLVM IR) keep their sums over the
heads for 32 values of d_model in eight vector registers, each head's vectors of f read once for both queries; each
value is then added to its query's row of the check's sum and its distance from y_i to the absolute sum. The key's
own query (where the residual joins) and a last odd query take a one-query path in numba's loops, as does every
query when d_model is not a multiple of 32. The weights of BLOCK keys are gathered together into [key, query, head],
each times s_i (read along the keys, so each cache line of weights is loaded once per block rather than once per
key), and f is read as [key, head, d_model] (each key's rows together: 12 rows a layer apart share their cache
sets). MiniLM at 128 tokens, one layer on one thread: 2.6-2.8 ms, against 4.0-4.4 ms for numba's loops alone and
about 3 times that for the torch calls (docs/attribution.md, Cost).

The sum: summed[i] = sum_j T_i(x_j), the very values whose distances were taken, added up in float32 key after key
(each thread its own rows, added in float64 at the end), so alti.layer_alti's check (summed_i + bias_i against the
block output captured from the model) covers what the distances read: a wrong f, weight or residual share moves it.

Rounding: float32 products and sums in an order the compiler picks (reassociation is allowed, so the sum over
d_model is vectorised; the tile's lanes are added in a fixed tree); a pair's bytes depend on which path took it, and
the paths are fixed by the pair's place, not by the threads; NaN and infinities are not assumed away. The tests hold
the contributions to the whole [query, key, d_model] tensor in float64 within 1e-5, and the sum to the whole
tensor's within float32's rounding.

Numba (and the llvmlite it brings) is part of the `attribute` extra; without it ALTI stops with one line naming the
install. The compiled code is cached beside alti_numba (or in numba's user-wide cache when that is read-only; with
no writable place, it is compiled once per process: ~6 s). Threads: the blocks of keys are dealt round-robin to
torch.get_num_threads() Python threads (the kernel releases the GIL), so a causal model's shorter late keys spread
evenly; each pair is summed in the same order whichever thread takes it (the distances' bytes do not depend on the
threads; the check's sum adds the threads' rows in another order, within its rounding).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from attnscope.errors import AttnscopeError

INSTALL = "pip install 'attnscope[attribute]' (or numba)"

Kernel = Callable[..., None]


def _numba() -> Any:
    try:
        import numba
    except ImportError as exc:
        raise AttnscopeError(f"ALTI's distance kernel needs numba: {INSTALL}", parameter="methods") from exc
    return numba


SIGNATURE = ("void(f4[:, :, ::1], f4[::1], f4[:, :, ::1], f4[:, ::1], f4[:, ::1], f4[:, ::1], b1[:, ::1], f4[:, ::1], "
             "i8, i8)")
FASTMATH = {"reassoc", "contract"}  # vectorised sums and fused multiply-adds; NaN and infinities kept


def _jit(fn: Callable[..., Any], signature: str, fastmath: set[str] | bool) -> Any:
    """fn compiled by numba for signature, cached on disk where numba finds a writable place."""
    numba = _numba()
    options = {"nogil": True, "fastmath": fastmath}
    try:
        return numba.njit(signature, cache=True, **options)(fn)
    except RuntimeError:  # numba found no writable cache directory: compile without one
        return numba.njit(signature, cache=False, **options)(fn)


@functools.cache
def compiled(heads: int) -> Kernel:
    """The kernel for `heads` heads, compiled once per process (loaded from numba's cache when it has it)."""
    _numba()
    from attnscope.attribution.alti_numba import source

    return _jit(source(heads), SIGNATURE, FASTMATH)  # type: ignore[no-any-return]


@functools.cache
def _finish() -> Callable[..., float]:
    _numba()
    from attnscope.attribution.alti_numba import FINISH_SIGNATURE, finish

    return _jit(finish, FINISH_SIGNATURE, False)  # type: ignore[no-any-return]  # strict: NaN and order kept


@functools.cache
def _rewrite() -> Callable[..., None]:
    _numba()
    from attnscope.attribution.alti_numba import REWRITE_SIGNATURE, rewrite

    return _jit(rewrite, REWRITE_SIGNATURE, FASTMATH)  # type: ignore[no-any-return]


def rewritten(x: torch.Tensor, received: torch.Tensor, w_o: torch.Tensor, b_o: torch.Tensor, gamma: torch.Tensor,
              beta: torch.Tensor, eps: float, centred: bool,
              sandwich: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """alti.parts' rewrite of a block with a norm after the attention sum, compiled (alti_numba.rewrite), float32 on
    the CPU: W' [head * d_head, d_model] (a transposed view, as nn.Linear's W_O is), the diagonal and the bias
    [query, d_model], and the scale [query]. x, received [query, d_model]; w_o [head * d_head, d_model]; b_o, gamma,
    beta [d_model]."""
    n, d = x.shape
    w_t = w_o.transpose(0, 1)  # [d_model, head * d_head]: nn.Linear's own layout (no copy for a Linear's W_O)
    arrays = [t.detach().to("cpu", torch.float32).contiguous().numpy() for t in (x, received, w_t, b_o, gamma, beta)]
    w_out = np.empty_like(arrays[2])
    diagonal, bias = np.empty((n, d), dtype=np.float32), np.empty((n, d), dtype=np.float32)
    scale = np.empty(n, dtype=np.float32)
    _rewrite()(*arrays, float(eps), centred, sandwich, w_out, diagonal, bias, scale)
    return torch.from_numpy(w_out).T, torch.from_numpy(diagonal), torch.from_numpy(bias), torch.from_numpy(scale)


def distances(weights: torch.Tensor, f: torch.Tensor, diagonal: torch.Tensor, y: torch.Tensor,
              scale: torch.Tensor | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """||T_i(x_j) - y_i||_1 [query, key] float32 on the CPU; absent [query, key]: no head weighs key j for query
    i != j, so T_i(x_j) = 0 (its distance is the caller's to set: ||y_i||_1 exactly; left 0 where skipped); and
    sum_j T_i(x_j) [query, d_model] float64, the T's the distances read, summed (alti.layer_alti checks it).
    weights [head, query, key], f [head, key, d_model], diagonal (r_i) and y [query, d_model]; scale [query]: each
    query's weights times scale_i as the kernel reads them (alti.Parts.scale; None: 1)."""
    out, absent, summed = run(weights, f, diagonal, y, scale)
    return out.T, absent.T, summed.sum(axis=0, dtype=np.float64)


def layer(weights: torch.Tensor, f: torch.Tensor, diagonal: torch.Tensor, y: torch.Tensor, bias: torch.Tensor,
          scale: torch.Tensor | None = None) -> tuple[np.ndarray, float]:
    """One layer's ALTI contributions c_ij [query, key] float64 and its check's error (alti.layer_alti): run(), then
    finished() over its results. bias [query, d_model]; the rest as distances()."""
    return finished(*run(weights, f, diagonal, y, scale), y, bias)


def finished(out: np.ndarray, absent: np.ndarray, summed: np.ndarray, y: torch.Tensor,
             bias: torch.Tensor) -> tuple[np.ndarray, float]:
    """run()'s results made into the contributions [query, key] float64 and the check's error, in one compiled pass
    (alti_numba.finish: ||y_i||_1, the clip, absent pairs at 0, rows normalised; max |sum_j T_i(x_j) + bias_i - y_i|
    relative to max(1, max |y|), the sum the kernel's own; y and bias as the kernel reads them, in float32)."""
    n = out.shape[0]
    contributions = np.empty((n, n), dtype=np.float64)
    y_, bias_ = (t.detach().to("cpu", torch.float32).contiguous().numpy() for t in (y, bias))
    error = _finish()(out, absent, y_, summed, bias_, contributions)
    return contributions, float(error)


def run(weights: torch.Tensor, f: torch.Tensor, diagonal: torch.Tensor, y: torch.Tensor,
        scale: torch.Tensor | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kernel's own results, as distances() takes its inputs: the distances out and absent [key, query], and
    summed [thread, query, d_model] float32, each thread's sum of the T's."""
    heads, n, d = (int(s) for s in f.shape)
    if scale is None:
        scale = torch.ones(n)
    if (weights.shape != (heads, n, n) or diagonal.shape != (n, d) or y.shape != (n, d)
            or scale.shape != (n,)):  # the kernel reads unchecked
        raise ValueError(f"ALTI's kernel: weights {tuple(weights.shape)}, f {tuple(f.shape)}, diagonal "
                         f"{tuple(diagonal.shape)}, y {tuple(y.shape)} and scale {tuple(scale.shape)} do not fit "
                         "[head, query, key], [head, key, d_model], [query, d_model] and [query]")
    kernel = compiled(heads)
    from attnscope.attribution.alti_numba import BLOCK  # numba is there: compiled() found it

    by_key = f.transpose(0, 1)  # [key, head, d_model]: a copy unless f was written so (alti.layer_alti's is)
    arrays = [t.detach().to("cpu", torch.float32).contiguous().numpy() for t in (weights, scale, by_key, diagonal, y)]
    out = np.zeros((n, n), dtype=np.float32)  # [key, query]
    absent = np.zeros((n, n), dtype=np.bool_)  # [key, query]
    threads = max(1, min(torch.get_num_threads(), -(-n // BLOCK)))  # at most one per block
    summed = np.zeros((threads, n, d), dtype=np.float32)  # one per thread
    if threads == 1:
        kernel(*arrays, out, absent, summed[0], 0, 1)
    else:  # keys dealt round-robin; each thread writes its own rows of out and absent, and its own summed[t]
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda t: kernel(*arrays, out, absent, summed[t], t, threads), range(threads)))
    return out, absent, summed

__all__ = ["INSTALL", "compiled", "distances", "finished", "layer", "rewritten", "run"]
