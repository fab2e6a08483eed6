"""The check's inner loops against the alternatives tried for them (docs/check-speed.md, issue 12).

One thread, each variant timed interleaved with the one attnscope uses, median of --repeats, printed as a
ratio to it; every variant that could replace the used one is first checked bit for bit against it:
  max |a - b| per head, on a chunk like SmolLM2's [2, 9, 256, 256]: subtract, abs, amax (used) |
      subtract, amax, amin | subtract, aminmax | subtract, vector_norm(ord=inf) | torch.dist(p=inf) per head
  are two chunks equal, [1, 12, 256, 256] like MiniLM's: np.array_equal (used) | np.equal into a kept
      buffer, then all | torch.equal | int32 views
  the softmax over keys, the same chunk: torch.softmax into a kept buffer (maths.softmax, used) |
      max, subtract, exp, sum, divide written out (the taught steps; not bit for bit: printed)
  q, k and v of 8 x 256 tokens, d_model 384 (MiniLM): maths.project, one addmm each as nn.Linear does
      (used) | matmul then add_ (before 2026-12-02) | one addmm of the three weights side by side

    .venv/bin/python benchmarks/bench_check_alternatives.py [--repeats 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
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
        print(f"  {name:44s} {seconds * 1e3:7.3f} ms   x {seconds / base:5.2f}")


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
    equality(args.repeats, gen)
    softmaxes(args.repeats, gen)
    projections(args.repeats, gen)


def equality(repeats: int, gen: torch.Generator) -> None:
    a = torch.rand(1, 12, 256, 256, generator=gen)  # [rows, head, query, key]: a chunk of MiniLM's weights
    b, flags = a.clone(), np.empty(a.shape, dtype=bool)
    x, y = a.numpy(), b.numpy()
    assert np.array_equal(x, y) and torch.equal(a, b) and bool(np.equal(x, y, out=flags).all())
    assert np.array_equal(x.view(np.int32), y.view(np.int32))
    report("are two chunks equal, [1, 12, 256, 256]", race({
        "np.array_equal (used)": lambda: np.array_equal(x, y),
        "np.equal into a kept buffer, all": lambda: np.equal(x, y, out=flags).all(),
        "torch.equal": lambda: torch.equal(a, b),
        "np.array_equal of int32 views": lambda: np.array_equal(x.view(np.int32), y.view(np.int32)),
    }, repeats))


def softmaxes(repeats: int, gen: torch.Generator) -> None:
    scores = torch.randn(1, 12, 256, 256, generator=gen) * 3
    out = torch.empty_like(scores)

    def written_out() -> torch.Tensor:
        shifted = scores - scores.amax(-1, keepdim=True)
        e = shifted.exp_()
        return e.div_(e.sum(-1, keepdim=True))

    same = torch.equal(written_out(), maths.softmax(scores, out=out))
    report("the softmax over keys, [1, 12, 256, 256]", race({
        "torch.softmax into a buffer (used)": lambda: maths.softmax(scores, out=out),
        f"max, sub, exp, sum, div ({'bit for bit' if same else 'not bit for bit'})": written_out,
    }, repeats))


def projections(repeats: int, gen: torch.Generator) -> None:
    x = torch.randn(8, 256, 384, generator=gen)  # [batch, token, d_model]
    linears = [torch.nn.Linear(384, 384) for _ in range(3)]
    w = [lin.weight.T for lin in linears]  # [d_model, d_head * head]: the x @ W convention of AttentionParams
    b: list[torch.Tensor] = [lin.bias for lin in linears]
    w_all, b_all = torch.cat(tuple(lin.weight for lin in linears)).T, torch.cat(b)  # the three side by side

    def before() -> list[torch.Tensor]:
        return [(x @ wi).add_(bi) for wi, bi in zip(w, b, strict=True)]

    def side_by_side() -> list[torch.Tensor]:
        return list(torch.split(torch.addmm(b_all, x.reshape(-1, 384), w_all).view(8, 256, 1152), 384, dim=-1))

    with torch.no_grad():
        model = [lin(x) for lin in linears]  # what the model computes
        for variant in (before(), side_by_side(), [maths.project(x, wi, bi) for wi, bi in zip(w, b, strict=True)]):
            assert all(torch.equal(mine, theirs) for mine, theirs in zip(variant, model, strict=True))
        report("q, k, v of [8, 256, 384] x [384, 384]", race({
            "maths.project: addmm (used)": lambda: [maths.project(x, wi, bi) for wi, bi in zip(w, b, strict=True)],
            "matmul, add_ (before)": before,
            "one addmm, weights side by side": side_by_side,
            "nn.Linear (the model)": lambda: [lin(x) for lin in linears],
        }, repeats))

if __name__ == "__main__":
    main()
