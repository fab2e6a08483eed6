"""Where a verified trace's time goes (docs/check-speed.md): (b) the eager forward with output_attentions
and (d) attnscope.trace with recompute and check, timed alone and alternately in one process (CPU seconds:
steady on a loaded machine), and (d) split into its parts, each as a fraction of (b).

    .venv/bin/python benchmarks/bench_check_parts.py [--model minilm|smollm2] [--texts 8] [--repeats 3]

The parts are timed by wrapping attnscope's own functions for the length of the run (nothing else is
changed); indented lines are inside the check.
"""

from __future__ import annotations

import argparse
import collections
import functools
import logging
import os
import statistics
import time
from collections.abc import Callable, MutableMapping
from typing import Any

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch

import attnscope
from attnscope import maths
from attnscope.tracing import one_pass as tracing
from attnscope.verify import check
from bench_trace import long_texts

SPENT: collections.defaultdict[str, float] = collections.defaultdict(float)
PARTS = [(tracing, "encode", "tokenize"), (check, "verify_batch", "check (verify_batch)"),
         (tracing, "model_outputs", "model outputs (x from hidden states)"), (tracing, "layer_params", "layer_params"),
         *((maths, f, f"  maths.{f}") for f in ("project", "softmax", "dot_scores", "scale", "attend", "merge_heads",
                                               "rotate")),
         *((check.ErrorTable, f, f"  check.{f}") for f in ("add_rows", "add_scores", "add_output", "add",
                                                          "add_same_rows"))]


def timed(owner: Any, name: str, label: str, spent: MutableMapping[str, float] = SPENT) -> None:
    """Replace owner.name by a wrapper that adds its CPU seconds to spent[label] (SPENT unless given)."""
    fn: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] += time.process_time() - start

    setattr(owner, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--texts", type=int, default=None, help="default: 8 for MiniLM, 4 for SmolLM2")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("attnscope").setLevel(logging.ERROR)
    m = attnscope.load_model(args.model)
    texts = long_texts(args.texts or (4 if args.model == "smollm2" else 8), 256, m.tokenizer)
    enc = m.tokenizer(texts, max_length=256, truncation=True, padding=True, return_tensors="pt")

    def eager() -> None:
        with torch.no_grad():
            m.base(**enc, output_attentions=True)

    def verified() -> None:
        for t in attnscope.trace(texts, model=m, max_length=256):
            t.check()

    timed(m.base, "forward", "forward (capture, hidden states)")
    for owner, name, label in PARTS:
        timed(owner, name, label)
    eager()
    verified()
    SPENT.clear()
    b: list[float] = []
    d: list[float] = []
    for _ in range(args.repeats):
        for fn, times in ((eager, b), (verified, d)):
            start = time.process_time()
            fn()
            times.append(time.process_time() - start)
    base = statistics.median(b)
    in_d = SPENT.pop("forward (capture, hidden states)") / args.repeats - base  # b's forwards counted too
    print(f"{m.name}, {len(texts)} texts x 256 tokens, CPU seconds, median of {args.repeats}, load average "
          f"{os.getloadavg()[0]:.1f}: (b) {base * 1e3:.0f} ms, (d) {statistics.median(d) * 1e3:.0f} ms "
          f"= {statistics.median(d) / base:.2f} x (b)")
    print(f"  {'forward (capture, hidden states)':38s} {in_d / base:6.3f} x (b)")
    for label, seconds in sorted(SPENT.items(), key=lambda kv: -kv[1]):
        print(f"  {label:38s} {seconds / args.repeats / base:6.3f} x (b)")


if __name__ == "__main__":
    main()
