"""Cost of rollout, flow and norms on the bundled model, as ratios to tracing the same text in the same run.

    .venv/bin/python benchmarks/bench_beyond_weights.py [--lengths 16 32 64] [--reference-up-to 16]

Flow is also timed against the paper's construction solved the textbook way (Edmonds–Karp in
floating point on the full (layers+1) x tokens graph), for the shorter lengths only: it is slow.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections import deque
from collections.abc import Callable

import numpy as np

import attnscope
from attnscope.norms import norm_attention
from attnscope.rollout import flow, residual_attention, rollout
from attnscope.verify.recompute import layer_params

TEXT = "The committee discussed the proposal at length before voting on the final amendments. " * 30


def best_of(fn: Callable[[], object], repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def edmonds_karp(cap: np.ndarray, s: int, t: int) -> float:
    residual = cap.copy()
    total = 0.0
    while True:
        parent = {s: s}
        queue = deque([s])
        while queue and t not in parent:
            a = queue.popleft()
            for b in np.nonzero(residual[a] > 1e-15)[0]:
                if int(b) not in parent:
                    parent[int(b)] = a
                    queue.append(int(b))
        if t not in parent:
            return total
        path = [t]
        while path[-1] != s:
            path.append(parent[path[-1]])
        edges = list(zip(path[1:], path[:-1], strict=True))
        push = min(residual[u, v] for u, v in edges)
        for u, v in edges:
            residual[u, v] -= push
            residual[v, u] += push
        total += push


def reference_flow(weights: np.ndarray) -> np.ndarray:
    a_hat = residual_attention(weights)
    layers, n, _ = a_hat.shape
    cap = np.zeros(((layers + 1) * n,) * 2)
    for i in range(1, layers + 1):
        cap[i * n:(i + 1) * n, (i - 1) * n:i * n] = a_hat[i - 1]
    values = np.array([[edmonds_karp(cap, layers * n + u, v) for v in range(n)] for u in range(n)])
    shares: np.ndarray = values / values.sum(-1, keepdims=True)  # [token, token]: each row sums to 1
    return shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--reference-up-to", type=int, default=16)
    args = parser.parse_args()
    model = attnscope.load_model()
    params = layer_params(model.model) or []
    w_o = [p.w_o.numpy() for p in params]
    print(f"{model.name}: {model.n_layers} layers x {model.n_heads} heads; times are best of 3 (1 for the reference)")
    print(f"{'tokens':>6} {'trace s':>8} {'rollout':>8} {'norms':>8} {'flow':>8} {'flow s':>8} {'reference':>10}")
    for n in args.lengths:
        tr = attnscope.trace(TEXT, model=model, max_length=n)
        base = best_of(functools.partial(attnscope.trace, TEXT, model=model, max_length=n))
        t_roll = best_of(functools.partial(rollout, tr.weights))
        t_norm = best_of(functools.partial(norm_attention, tr.arrays["v"], tr.weights, w_o))
        t_flow = best_of(functools.partial(flow, tr.weights, max_tokens=n), repeat=1)
        ref = ""
        if n <= args.reference_up_to:
            start = time.perf_counter()
            expected = reference_flow(tr.weights)
            t_ref = time.perf_counter() - start
            err = float(np.abs(flow(tr.weights, max_tokens=n) - expected).max())
            ref = f"{t_ref / t_flow:8.1f}x slower (max diff {err:.1e})"
        print(f"{n:>6} {base:>8.3f} {t_roll / base:>7.2f}x {t_norm / base:>7.2f}x {t_flow / base:>7.1f}x "
              f"{t_flow:>8.2f} {ref}")


if __name__ == "__main__":
    main()
