"""Faithfulness (issue 32): a run's time against the time of the forwards and backwards it needs, in the same run.

Per sentence of the UD slice (the first --sentences), `faithfulness.run.example_rows` with --methods (default: all
that apply), every metric, removal delete, is timed whole (`total`). In the same run the model's own forward and
backward calls are timed as they happen (hooks on the model's top module; torch.autograd.grad and
Tensor.backward wrapped), and every modified input the run scores (Perturber.scores, batched and padded) is
recorded. Then, with the timers off, those modified inputs are run again as plain forwards: each variant's kept
ids closed up, grouped by length (no padding), the model's own forward with logits_to_keep=1, no capture.
Times are this process's CPU seconds (--clock cpu, the default, on one torch thread: a shared machine's load
does not count) or wall seconds (--clock wall).

    needed = model time outside Perturber.scores (the methods' forwards and backwards, their checks' forwards,
             the objective's reference forward) + the plain forwards of every modified input
    ratio  = total / needed          (target <= 1.5)

Also printed: the modified inputs' forwards as the run does them against the plain ones (the batching and padding
overhead), and the time outside the model (metrics, attention flow's max-flows, recomputing checks, Python).
--engine ray: the same sentences through faithfulness(..., engine="ray", workers=2) against engine="local"
(the speed-up on 2 workers, rows compared), when this build has the parameter.

Usage: .venv/bin/python benchmarks/bench_faithfulness.py [--sentences 2] [--models smollm2,minilm]
       [--methods all] [--max-length 16] [--engine ray]
"""

from __future__ import annotations

import argparse
import inspect
import json
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import attnscope
from attnscope.attribution.methods import method_names
from attnscope.attribution.objective import CAUSAL, kind_of
from attnscope.faithfulness import perturb
from attnscope.faithfulness.run import Settings, example_rows, faithfulness
from attnscope.stats.sources import Document, Source
from corpus import ud_dev

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
now = CLOCKS["cpu"]  # --clock: this process's CPU seconds by default (other processes' load does not count)


@dataclass
class Clock:
    """Seconds inside the model's forwards and backwards (outermost calls only), and the scored masks."""

    model: float = 0.0
    in_perturber: float = 0.0  # the part of `model` spent inside Perturber.scores
    perturber: float = 0.0  # Perturber.scores' own wall time
    depth: int = 0
    started: float = 0.0
    scoring: bool = False
    masks: list[tuple[np.ndarray, torch.Tensor]] = field(default_factory=list)  # (keep, ids) per scores call

    def enter(self) -> None:
        if self.depth == 0:
            self.started = now()
        self.depth += 1

    def leave(self) -> None:
        self.depth -= 1
        if self.depth == 0:
            spent = now() - self.started
            self.model += spent
            self.in_perturber += spent if self.scoring else 0.0


def _timed(clock: Clock, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        clock.enter()
        try:
            return fn(*args, **kwargs)
        finally:
            clock.leave()
    return wrapper


@contextmanager
def instrumented(m: attnscope.Model, clock: Clock) -> Iterator[None]:
    """Time the model's forwards and backwards, and record Perturber.scores' masks, within the block."""
    tops = {id(mod): mod for mod in (m.model, m.base)}.values()
    handles = [h for mod in tops for h in (mod.register_forward_pre_hook(lambda *_: clock.enter()),
                                           mod.register_forward_hook(lambda *_: clock.leave()))]
    grad, backward, scores = torch.autograd.grad, torch.Tensor.backward, perturb.Perturber.scores

    def recorded(self: perturb.Perturber, keep: np.ndarray) -> np.ndarray:
        clock.masks.append((keep.copy(), self.objective.ids.reshape(-1).clone()))  # [token]
        clock.scoring, start = True, now()
        try:
            out: np.ndarray = scores(self, keep)
            return out
        finally:
            clock.scoring, clock.perturber = False, clock.perturber + now() - start

    torch.autograd.grad = _timed(clock, grad)  # type: ignore[assignment]
    torch.Tensor.backward = _timed(clock, backward)  # type: ignore[method-assign]
    perturb.Perturber.scores = recorded  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.autograd.grad = grad
        torch.Tensor.backward = backward  # type: ignore[method-assign]
        perturb.Perturber.scores = scores  # type: ignore[method-assign]
        for h in handles:
            h.remove()


def plain_forwards(m: attnscope.Model, masks: list[tuple[np.ndarray, torch.Tensor]],
                   rows_tokens: int = 4096) -> float:
    """Seconds of the plain forwards of every recorded modified input: kept ids closed up, equal lengths batched."""
    by_length: dict[int, list[torch.Tensor]] = {}
    for keep, ids in masks:
        for row in keep:
            kept = ids[torch.from_numpy(row)]
            by_length.setdefault(int(kept.shape[0]), []).append(kept)
    causal = kind_of(m) == CAUSAL
    start = now()
    with torch.inference_mode():
        for n, rows in by_length.items():
            step = max(1, rows_tokens // n)
            for i in range(0, len(rows), step):
                batch = torch.stack(rows[i:i + step]).to(m.device)  # [variant, token]
                if causal:
                    m.model(input_ids=batch, logits_to_keep=1)
                else:
                    m.base(input_ids=batch, attention_mask=torch.ones_like(batch))
    return now() - start


def bench_model(name: str, sentences: int, methods: str | None, max_length: int) -> dict[str, float]:
    m = attnscope.load_model(None if name == "minilm" else name)
    settings = Settings(methods=tuple(method_names(methods)) if methods else None,
                        max_length=max_length)
    docs = list(zip(range(sentences), Source(str(ud_dev())), strict=False))
    example_rows(m, Document(text="The cat sat down .", where="warm-up"), 0, settings)  # lazy imports, first calls
    totals = {"total": 0.0, "model": 0.0, "in_perturber": 0.0, "perturber": 0.0, "plain": 0.0, "variants": 0.0}
    print(f"\n{name}: {sentences} sentences, max length {max_length}, methods {methods or 'the defaults'}")
    print(f"{'sentence':>8} {'tokens':>6} {'variants':>8} {'total s':>8} {'needed s':>8} {'ratio':>6} "
          f"{'perturbed as run':>16} {'plain':>7} {'outside model':>13}")
    for index, doc in docs:
        clock = Clock()
        with instrumented(m, clock):
            start = now()
            rows = example_rows(m, doc, index, settings)
            total = now() - start
        if not rows:
            continue
        plain = plain_forwards(m, clock.masks)
        needed = clock.model - clock.in_perturber + plain
        variants = sum(k.shape[0] for k, _ in clock.masks)
        print(f"{index:>8} {rows[0]['tokens']:>6} {variants:>8} {total:>8.2f} {needed:>8.2f} {total / needed:>6.2f} "
              f"{clock.perturber:>16.2f} {plain:>7.2f} {total - clock.model:>13.2f}")
        for key, value in (("total", total), ("model", clock.model), ("in_perturber", clock.in_perturber),
                           ("perturber", clock.perturber), ("plain", plain), ("variants", variants)):
            totals[key] += value
    needed = totals["model"] - totals["in_perturber"] + totals["plain"]
    print(f"{'all':>8} {'':>6} {int(totals['variants']):>8} {totals['total']:>8.2f} {needed:>8.2f} "
          f"{totals['total'] / needed:>6.2f} {totals['perturber']:>16.2f} {totals['plain']:>7.2f} "
          f"{totals['total'] - totals['model']:>13.2f}")
    print(f"ratio total / needed: {totals['total'] / needed:.2f} (target <= 1.5); the modified inputs as the run "
          f"scores them / plain: {totals['perturber'] / totals['plain']:.2f}; "
          f"500 sentences at this pace: {500 * totals['total'] / max(1, len(docs)) / 3600:.1f} h")
    return totals


def bench_ray(name: str, sentences: int, methods: str | None, max_length: int) -> None:
    """faithfulness(engine="ray", workers=2) against engine="local" on the same sentences, when available."""
    if "engine" not in inspect.signature(faithfulness).parameters:
        print("Ray: not available in this build")
        return
    kw: dict[str, Any] = {"methods": methods, "limit": sentences, "max_length": max_length}
    if "png" in inspect.signature(faithfulness).parameters:
        kw["png"] = False
    with tempfile.TemporaryDirectory() as tmp:
        model = None if name == "minilm" else name
        start = time.perf_counter()
        local = faithfulness(str(ud_dev()), Path(tmp) / "local", model, **kw)
        t_local = time.perf_counter() - start
        start = time.perf_counter()
        try:
            ray = faithfulness(str(ud_dev()), Path(tmp) / "ray", model, engine="ray", workers=2, threads=1, **kw)
        except attnscope.AttnscopeError as exc:
            print(f"Ray: {exc}")
            return
        t_ray = time.perf_counter() - start
        same = json.dumps(local.rows) == json.dumps(ray.rows)
        print(f"Ray on 2 workers, {name}, {sentences} sentences: local {t_local:.1f} s, ray {t_ray:.1f} s, "
              f"speed-up {t_local / t_ray:.2f}x (model loading and Ray start-up included); rows equal: {same}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sentences", type=int, default=2,
                   help="sentences per model (default 2: a few CPU minutes; 500: see the printed estimate)")
    p.add_argument("--models", default="smollm2,minilm", help="comma-separated: smollm2, minilm")
    p.add_argument("--methods", default=None, help="attribution methods (default: all that apply)")
    p.add_argument("--max-length", type=int, default=16, help="tokens per sentence (default 16)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--clock", choices=tuple(CLOCKS), default="cpu",
                   help="cpu: this process's CPU seconds (default; robust to a shared machine's load), or wall")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="ray: also time engine='ray' on 2 workers against local")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    global now
    now = CLOCKS[args.clock]
    print(f"torch threads: {torch.get_num_threads()}; clock: {args.clock}; attnscope {attnscope.__version__}")
    for name in args.models.split(","):
        bench_model(name, args.sentences, args.methods, args.max_length)
        if args.engine == "ray":
            bench_ray(name, args.sentences, args.methods, args.max_length)


if __name__ == "__main__":
    main()
