"""The check's inner loops against the alternatives tried for them (docs/check-speed.md, issue 12).

On one chunk of a causal attention map like SmolLM2's ([2, 9, 256, 256] float32, one thread), each
variant timed interleaved with the one attnscope uses, median of --repeats, printed as a ratio to it:
  max |a - b| per head: subtract, abs, amax (used) | subtract, amax, amin | subtract, aminmax |
      subtract, vector_norm(ord=inf) | torch.dist(p=inf) per head
  the softmax's exp of masked scores: maths._exp_visible_ (x visible, exp, x visible: used where the mask is
      known) | maths._exp_ (add, clamp, mul, exp, mul: used without a mask) | plain exp (slow path) |
      a boolean mask instead of the factor | threshold to +inf, exp, nan_to_num
Every variant that replaces the used one is checked bit for bit against it first.

    .venv/bin/python benchmarks/bench_check_alternatives.py [--repeats 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

from attnscope import maths

Fn = Callable[[], object]


def race(variants: dict[str, Fn], repeats: int) -> dict[str, float]:
    """Median seconds of each variant, run round-robin."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for fn in variants.values():
        fn()
    for _ in range(repeats):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def report(title: str, medians: dict[str, float]) -> None:
    base = next(iter(medians.values()))
    print(title)
    for name, seconds in medians.items():
        print(f"  {name:34s} {seconds * 1e3:7.3f} ms   x {seconds / base:5.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=40)
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    a = torch.rand(2, 9, 256, 256, generator=gen)  # [rows, head, query, key]
    b = a + torch.randn(a.shape, generator=gen) * 1e-7
    d = torch.empty_like(a)
    per_head = a.flatten(0, 1), b.flatten(0, 1)
    used = torch.sub(a, b, out=d).abs_().flatten(2).amax(2)
    two = torch.sub(a, b, out=d).flatten(2)
    assert torch.equal(used, torch.maximum(two.amax(2), -two.amin(2)))
    print(f"load average {os.getloadavg()[0]:.1f}")
    report("max |a - b| per head, [2, 9, 256, 256]", race({
        "sub, abs_, amax (used)": lambda: torch.sub(a, b, out=d).abs_().flatten(2).amax(2),
        "sub, amax, amin": lambda: (torch.sub(a, b, out=d).flatten(2).amax(2), d.flatten(2).amin(2)),
        "sub, aminmax": lambda: torch.aminmax(torch.sub(a, b, out=d).flatten(2), dim=2),
        "sub, vector_norm(inf)": lambda: torch.linalg.vector_norm(torch.sub(a, b, out=d).flatten(2), ord=torch.inf,
                                                                  dim=2),
        "dist(p=inf), head by head": lambda: [torch.dist(x, y, p=torch.inf) for x, y in zip(*per_head, strict=True)],
    }, args.repeats))
    causal = torch.full((256, 256), torch.finfo(torch.float32).min).triu(1)  # [query, key]
    t0 = torch.randn(a.shape, generator=gen) * 3 + causal
    t0 -= t0.amax(-1, keepdim=True)
    t, flags, scratch = torch.empty_like(t0), torch.empty(t0.shape, dtype=torch.bool), {}

    def flagged() -> torch.Tensor:
        f = torch.gt(t.copy_(t0), maths._ZERO_EXP, out=flags)
        return t.mul_(f).exp_().mul_(f)

    def thresholded() -> torch.Tensor:
        big = torch.nn.functional.threshold_(t.copy_(t0), maths._ZERO_EXP, torch.inf)
        return torch.nan_to_num_(big.exp_(), nan=torch.nan, posinf=0.0)

    visible = (causal == 0).float()  # [query, key]: 1 where the mask lets the key through
    row_max = torch.zeros(*a.shape[:-1], 1)  # t0's rows already had their max subtracted

    def seen() -> torch.Tensor:
        return maths._exp_visible_(t.copy_(t0), row_max, visible, scratch)

    exact = maths._exp_(t0.clone(), scratch).view(torch.int32)
    assert torch.equal(flagged().view(torch.int32), exact) and torch.equal(thresholded().view(torch.int32), exact)
    assert torch.equal(seen().view(torch.int32), exact)
    report("exp of causal-masked scores minus their row max, [2, 9, 256, 256] (each includes a copy)", race({
        "maths._exp_visible_ (used with a mask)": seen,
        "maths._exp_ (used without)": lambda: maths._exp_(t.copy_(t0), scratch),
        "plain exp_": lambda: t.copy_(t0).exp_(),
        "boolean mask (gt, mul, exp, mul)": flagged,
        "threshold +inf, exp, nan_to_num": thresholded,
        "the copy alone": lambda: t.copy_(t0),
    }, args.repeats))


if __name__ == "__main__":
    main()
