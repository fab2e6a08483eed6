"""ALTI's distance kernel as numba compiles it (attribution.alti_kernel says what it computes and calls it): the
kernel's Python source, and its tile, vector code written out as LLVM IR. Importing this module needs numba
(alti_kernel imports it only once numba is known to be there).

The tile: for one key j and QUERIES queries, the sums T_i(x_j) = sum_h weights[h, i, j] f[h, j] of STEP values of
d_model at a time stay in vector registers (QUERIES x VECTORS of them): each head's VECTORS vectors of f are read
once for all the queries, and each weight is broadcast once for its VECTORS vectors. Each T is then added to its
row of the check's sum and |T - y_i| to the query's vector of distances, whose lanes are added at the end in a fixed
tree. Numba's own loops (written as Python) vectorise the sum over the heads one query at a time, reading each
vector of f once per query; the tile reads it once per QUERIES queries and keeps twice the sums in flight (MiniLM at
128 tokens, one layer on one thread: 2.6-2.8 ms against 4.0-4.4).

The kernel itself is a closure over the head count (a compile-time constant: numba unrolls the heads' loop of the
one-query path), and the tile a global of this module, so numba's cache finds it again in the next process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

BLOCK = 8  # keys whose weights are gathered together (MiniLM, one layer: 3.6-3.7 ms at 8, 3.7-3.8 at 16)
LANES = 8  # float32 values in a vector (AVX2's; where the CPU's are narrower, LLVM splits them)
QUERIES = 2  # queries a tile takes at once
VECTORS = 4  # vectors of d_model a tile sums at once: 2 x 4 sums, 4 of f, 2 distances and a weight in 16 registers
STEP = VECTORS * LANES  # values of d_model per step of a tile: a d_model that is a multiple of it takes the tiles

_F32, _I64, _I32 = ir.FloatType(), ir.IntType(64), ir.IntType(32)
_VECTOR = ir.VectorType(_F32, LANES)
_CONTRACT = ("contract",)  # a product and its sum may fuse into one multiply-add; nothing else is assumed


class _Emitter:
    """Small helpers over one IR builder: constants, vector addresses, loads, stores and broadcasts."""

    def __init__(self, builder: ir.IRBuilder) -> None:
        self.b = builder

    def const(self, k: int) -> ir.Constant:
        return ir.Constant(_I64, k)

    def index(self, *terms: Any) -> Any:
        total = terms[0]
        for term in terms[1:]:
            total = self.b.add(total, term)
        return total

    def load(self, base: Any, index: Any) -> Any:  # LANES float32 values from base[index]
        return self.b.load(self.b.bitcast(self.b.gep(base, [index]), _VECTOR.as_pointer()), align=4)

    def store(self, value: Any, base: Any, index: Any) -> None:
        self.b.store(value, self.b.bitcast(self.b.gep(base, [index]), _VECTOR.as_pointer()), align=4)

    def broadcast(self, base: Any, index: Any) -> Any:  # base[index] in every lane
        one = self.b.insert_element(ir.Constant(_VECTOR, ir.Undefined), self.b.load(self.b.gep(base, [index])),
                                    ir.Constant(_I32, 0))
        return self.b.shuffle_vector(one, ir.Constant(_VECTOR, ir.Undefined),
                                     ir.Constant(ir.VectorType(_I32, LANES), [0] * LANES))

    def lanes_added(self, v: Any) -> Any:  # the lanes' sum, in a fixed tree
        lanes = [self.b.extract_element(v, ir.Constant(_I32, k)) for k in range(LANES)]
        while len(lanes) > 1:
            lanes = [self.b.fadd(lanes[k], lanes[k + 1]) for k in range(0, len(lanes), 2)]
        return lanes[0]


Body = Callable[[Any, list[Any]], tuple[Any, list[Any]]]  # (k, carried values) -> (the next k, the values after)


def _loop(e: _Emitter, start: Any, count: Any, carried: list[Any], body: Body) -> list[Any]:
    """k = start; do: k, carried = body(k, carried) while k < count (at least once: count > start); the carried
    values after the last step."""
    b = e.b
    before, loop, done = b.block, b.append_basic_block("alti.loop"), b.append_basic_block("alti.done")
    b.branch(loop)
    b.position_at_end(loop)
    k = b.phi(_I64)
    k.add_incoming(start, before)
    phis = [b.phi(v.type) for v in carried]
    for phi, v in zip(phis, carried, strict=True):
        phi.add_incoming(v, before)
    following, after = body(k, phis)
    k.add_incoming(following, b.block)
    for phi, v in zip(phis, after, strict=True):
        phi.add_incoming(v, b.block)
    b.cbranch(b.icmp_signed("<", following, count), loop, done)
    b.position_at_end(done)
    return list(after)


def _tile_code(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
    _, a, heads, _, _, i, _, d = args  # the arrays' data pointers below
    e = _Emitter(builder)
    block, fj, y, summed = (context.make_array(signature.args[k])(context, builder, args[k]).data
                            for k in (0, 3, 4, 6))
    fabs_type = ir.FunctionType(_VECTOR, [_VECTOR])
    fabs = cgutils.get_or_insert_function(builder.module, fabs_type, f"llvm.fabs.v{LANES}f32")  # type: ignore[no-untyped-call]
    zero = ir.Constant(_VECTOR, [0.0] * LANES)

    def heads_step(c: Any) -> Body:
        def body(h: Any, t: list[Any]) -> tuple[Any, list[Any]]:  # t [query x vector]: the sums so far
            row = e.index(builder.mul(h, d), c)  # fj[h, c]
            f = [e.load(fj, e.index(row, e.const(k * LANES))) for k in range(VECTORS)]
            out = []
            for q in range(QUERIES):
                w = e.broadcast(block, e.index(a, builder.mul(e.const(q), heads), h))  # weights[h, i + q, j]
                out += [builder.fadd(builder.fmul(w, f[k], flags=_CONTRACT), t[q * VECTORS + k], flags=_CONTRACT)
                        for k in range(VECTORS)]
            return builder.add(h, e.const(1)), out
        return body

    def d_step(c: Any, distance: list[Any]) -> tuple[Any, list[Any]]:  # distance [query]: |T - y| so far
        t = _loop(e, e.const(0), heads, [zero] * (QUERIES * VECTORS), heads_step(c))
        after = []
        for q in range(QUERIES):
            row, total = e.index(builder.mul(e.index(i, e.const(q)), d), c), distance[q]
            for k in range(VECTORS):
                where, tq = e.index(row, e.const(k * LANES)), t[q * VECTORS + k]
                e.store(builder.fadd(e.load(summed, where), tq), summed, where)  # the check's sum
                total = builder.fadd(total, builder.call(fabs, [builder.fsub(tq, e.load(y, where))]))
            after.append(total)
        return builder.add(c, e.const(STEP)), after

    distances = _loop(e, e.const(0), d, [zero] * QUERIES, d_step)
    return context.make_tuple(builder, signature.return_type, [e.lanes_added(v) for v in distances])


@intrinsic
def tile(typingctx: Any, block: Any, a: Any, heads: Any, fj: Any, y: Any, i: Any, summed: Any, d: Any) -> Any:
    """tile(block, a, heads, fj, y, i, summed, d) -> the distances ||T_i(x_j) - y_i||_1 of queries i .. i + QUERIES
    - 1 from one key j, their T's added to summed's rows. block: weights, flat, query i's [head] weights on key j
    from block[a] (the next query's follow); fj [head * d_model]: f[:, j] flat; y, summed [query, d_model]; d:
    d_model, a multiple of STEP; no query is j (the residual's share is the one-query path's)."""
    returned = types.UniTuple(types.float32, QUERIES)  # type: ignore[no-untyped-call]
    return returned(block, a, heads, fj, y, i, summed, d), _tile_code


Kernel = Callable[..., None]


def source(heads: int) -> Kernel:
    """The kernel's Python source for `heads` heads (a closure constant: numba unrolls the one-query heads' loop)."""

    def kernel(weights: np.ndarray, scale: np.ndarray, f: np.ndarray, own: np.ndarray, y: np.ndarray,
               out: np.ndarray, absent: np.ndarray, summed: np.ndarray, start: int, step: int) -> None:
        # weights [head, query, key], read times scale [query] (alti.Parts.scale: a norm's 1 / sigma_i, folded in
        # as the weights are gathered), f [key, head, d_model] (one key's rows together), own = r and y [query,
        # d_model], out [key, query]: d_ij for this thread's keys; absent [key, query]: no head weighs key j for
        # query i != j (T_i(x_j) = 0); a key's absent queries before the first that weighs it are skipped (a
        # decoder's); summed [query, d_model] float32: this thread's T_i(x_j) summed over its keys; start, step:
        # this thread takes the blocks of BLOCK keys start, start + step, ...
        n, d = y.shape
        flat_f = f.reshape(n * heads * d)  # [key, head, d_model] flat: one key's rows together
        block = np.empty((BLOCK, n, heads), dtype=np.float32)  # a block of keys' weights [key, query, head]
        flat = block.reshape(BLOCK * n * heads)
        zero = np.zeros(d, dtype=np.float32)  # the residual's share of every query but the key's own
        tiled = d % STEP == 0
        for j0 in range(start * BLOCK, n, step * BLOCK):  # this thread's blocks of keys
            width = min(BLOCK, n - j0)
            for h in range(heads):  # read along the keys, BLOCK at a time (key by key, each load was a cache line)
                for q in range(n):
                    for b in range(width):
                        block[b, q, h] = weights[h, q, j0 + b] * scale[q]
            for b in range(width):
                j = j0 + b
                by_key = block[b]  # [query, head]
                first = j  # the first query that weighs key j (a decoder's key: itself)
                for q in range(n):
                    weighed = False
                    for h in range(heads):
                        weighed = weighed or by_key[q, h] != 0  # NaN weighs
                    absent[j, q] = not weighed and q != j
                    if weighed and q < first:
                        first = q
                fj = f[j]  # [head, d_model]
                key_f = flat_f[j * heads * d:(j + 1) * heads * d]  # the same, flat, as the tile reads it
                i = first
                while i < n:
                    if tiled and i + QUERIES <= n and not i <= j < i + QUERIES:  # QUERIES queries at once
                        found: tuple[float, ...] = tile(  # type: ignore[call-arg]  # numba passes typingctx
                            flat, (b * n + i) * heads, heads, key_f, y, i, summed, d)
                        for q in range(QUERIES):
                            out[j, i + q] = found[q]
                        i += QUERIES
                        continue
                    # one query, its weights in registers: the key's own (with r_j) and the last ones
                    a, share, yi, row = by_key[i], own[i] if i == j else zero, y[i], summed[i]
                    s = np.float32(0.0)
                    for k in range(d):
                        t = share[k]  # the residual r_j joins at its own query
                        for h in range(heads):
                            t += a[h] * fj[h, k]
                        row[k] += t
                        s += abs(t - yi[k])
                    out[j, i] = s
                    i += 1

    return kernel


def finish(out: np.ndarray, absent: np.ndarray, y: np.ndarray, summed: np.ndarray, bias: np.ndarray,
           contributions: np.ndarray) -> float:
    """The layer's contributions and its check in one pass over the kernel's results (alti.layer_alti reads both).

    out, absent [key, query]: the kernel's distances and absent pairs; y, bias [query, d_model]; summed [thread,
    query, d_model]: the threads' sums of the T's. Writes contributions [query, key] float64: the paper's c_ij =
    max(0, ||y_i||_1 - d_ij), 0 where absent (T = 0 is exactly ||y_i||_1 away), rows divided by their sums (a row
    summing to 0 left as it is: mixing.normalise_rows). Returns the check's error: max |sum_t summed[t] + bias - y|
    over the layer, in float64, relative to max(1, max |y|) (alti.summed_error). A NaN anywhere stays NaN (the
    comparisons below are written so it wins), and nothing is clipped but the method's own clip at 0."""
    n, d = y.shape
    error, largest = 0.0, 0.0
    for i in range(n):
        norm = 0.0  # ||y_i||_1
        for k in range(d):
            yk = np.float64(y[i, k])
            norm += abs(yk)
            largest = abs(yk) if abs(yk) > largest or yk != yk else largest  # a NaN, once in, stays
            total = np.float64(0.0)
            for t in range(summed.shape[0]):
                total += summed[t, i, k]
            gap = abs(total + np.float64(bias[i, k]) - yk)
            error = gap if gap > error or gap != gap else error  # a NaN, once in, stays
        row = 0.0
        for j in range(n):
            close = 0.0 if absent[j, i] else norm - np.float64(out[j, i])
            close = 0.0 if close < 0.0 else close  # the method's clip; NaN kept
            contributions[i, j] = close
            row += close
        if row != 0.0:
            for j in range(n):
                contributions[i, j] /= row
    return error / (largest if largest > 1.0 or largest != largest else 1.0)


FINISH_SIGNATURE = "f8(f4[:, ::1], b1[:, ::1], f4[:, ::1], f4[:, :, ::1], f4[:, ::1], f8[:, ::1])"


def rewrite(x: np.ndarray, received: np.ndarray, w_t: np.ndarray, b_o: np.ndarray, gamma: np.ndarray,
            beta: np.ndarray, eps: float, centred: bool, sandwich: bool, w_out: np.ndarray, diagonal: np.ndarray,
            bias: np.ndarray, scale: np.ndarray) -> None:
    """alti.parts' rewrite of a block whose norm follows the attention sum, in one compiled pass per array
    (alti.layer_alti's float32 path; parts() itself stays the definition, and a test holds the two together).

    x, received [query, d_model]: the residual and what the norm received; w_t [d_model, head * d_head]: W_O as
    nn.Linear stores it (W_O transposed); b_o, gamma, beta [d_model]. Writes w_out [d_model, head * d_head]: W'
    transposed, W_O centred over d_model (a LayerNorm's) times gamma; diagonal, bias [query, d_model]; scale [query]:
    1 / sigma_i of the full sum (1 / rms_i). Sums in float64, results rounded to float32 once; NaN kept."""
    n, d = x.shape
    inner = w_t.shape[1]
    means = np.zeros(inner, dtype=np.float64)  # W_O's mean over d_model, one per row of W_O
    if centred:
        for c in range(d):
            for e in range(inner):
                means[e] += w_t[c, e]
        for e in range(inner):
            means[e] /= d
    for c in range(d):
        for e in range(inner):
            w_out[c, e] = np.float32((w_t[c, e] - means[e]) * gamma[c])
    b_mean = 0.0
    if centred:
        for c in range(d):
            b_mean += b_o[c]
        b_mean /= d
    for i in range(n):
        mean = 0.0
        if centred:
            for c in range(d):
                mean += received[i, c]
            mean /= d
        spread = 0.0
        for c in range(d):
            gap = received[i, c] - mean
            spread += gap * gap
        inv = 1.0 / np.sqrt(spread / d + eps)
        scale[i] = np.float32(inv)
        x_mean = 0.0
        if centred and not sandwich:
            for c in range(d):
                x_mean += x[i, c]
            x_mean /= d
        for c in range(d):
            bias[i, c] = np.float32((b_o[c] - b_mean) * gamma[c] * inv + beta[c])
            diagonal[i, c] = x[i, c] if sandwich else np.float32((x[i, c] - x_mean) * gamma[c] * inv)


REWRITE_SIGNATURE = ("void(f4[:, ::1], f4[:, ::1], f4[:, ::1], f4[::1], f4[::1], f4[::1], f8, b1, b1, f4[:, ::1], "
                     "f4[:, ::1], f4[:, ::1], f4[::1])")


__all__ = ["BLOCK", "FINISH_SIGNATURE", "QUERIES", "REWRITE_SIGNATURE", "STEP", "finish", "rewrite", "source",
           "tile"]
