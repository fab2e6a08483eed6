"""How much does tracing cost next to a plain forward pass? (issue: Core)

On 8 texts x 256 tokens with the bundled model, in one process:
  (a) plain forward with SDPA            (b) eager forward with output_attentions=True
  (c) attnscope.trace, capture only       (d) attnscope.trace with recompute, then check()
Prints the median time of each, the ratios to (a) and (b), and the peak RSS.
Targets: (c) <= 1.1x (b); (d) <= 1.5x (b).

A trace's arrays are laid out [layer, ...] per text when first read (check() reads none), so
two more lines show what (c) leaves for later and what bounds (d) from below:
  (c+) (c), then every array of every trace read once
  (e)  (b) plus the time its own attention sublayers took (the self-attention modules and the
       output projections, timed with hooks inside (b)): a recompute as fast as the model's own
       code, with no comparison at all, would cost this much

    .venv/bin/python benchmarks/bench_trace.py [--repeats 5] [--texts 8] [--tokens 256] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from collections.abc import Callable
from functools import partial

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch
from transformers import AutoModel

import attnscope
from attnscope.models import bundled_model_path
from corpus import ud_dev

UD_DEV = ud_dev()


def long_texts(n_texts: int, tokens: int, tokenizer: object) -> list[str]:
    """n_texts distinct texts of at least `tokens` tokens each, from the UD English dev set."""
    sents = [line[9:].strip() for line in UD_DEV.read_text(encoding="utf-8").splitlines()
             if line.startswith("# text = ")]
    texts, start = [], 0
    for _ in range(n_texts):
        words: list[str] = []
        while len(tokenizer(" ".join(words))["input_ids"]) < tokens + 2:  # type: ignore[operator]
            words.append(sents[start % len(sents)])
            start += 1
        texts.append(" ".join(words))
    return texts


def sublayer_seconds(m: attnscope.Model, forward: Callable[[], object]) -> float:
    """Seconds the forward spends in its self-attention modules and attention output projections."""
    spent = [0.0]
    started: list[float] = []
    hooks = []
    for layer in m.model.encoder.layer:
        for mod in (layer.attention.self, layer.attention.output.dense):
            hooks.append(mod.register_forward_pre_hook(lambda *_: started.append(time.perf_counter())))
            hooks.append(mod.register_forward_hook(
                lambda *_: spent.__setitem__(0, spent[0] + time.perf_counter() - started.pop())))
    try:
        forward()
    finally:
        for h in hooks:
            h.remove()
    return spent[0]


def median_times(cases: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each case, run round-robin so that a noisy machine weighs on all alike.
    A case that returns a float reports that many seconds itself."""
    for fn in cases.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            t = time.perf_counter()
            out = fn()
            times[name].append(out if isinstance(out, float) else time.perf_counter() - t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--texts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: on a shared 2-core machine two threads spin on each other)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    m = attnscope.load_model()
    sdpa = AutoModel.from_pretrained(str(bundled_model_path()), attn_implementation="sdpa").eval()
    texts = long_texts(args.texts, args.tokens, m.tokenizer)
    enc = m.tokenizer(texts, max_length=args.tokens, truncation=True, padding=True, return_tensors="pt")
    assert enc["input_ids"].shape == (args.texts, args.tokens)

    def plain_sdpa() -> object:
        with torch.no_grad():
            return sdpa(**enc)

    def eager_attentions() -> object:
        with torch.no_grad():
            return m.model(**enc, output_attentions=True)

    def capture_only() -> object:
        return attnscope.trace(texts, model=m, max_length=args.tokens, recompute=False)

    def capture_and_read() -> object:
        traces = attnscope.trace(texts, model=m, max_length=args.tokens, recompute=False)
        return [[t.arrays[s] for s in t.arrays] for t in traces]

    def recompute_and_check() -> object:
        traces = attnscope.trace(texts, model=m, max_length=args.tokens)
        reports = [t.check() for t in traces]
        assert all(r.ok for r in reports), max(r.max_error for r in reports)
        return reports

    cases = {"(a) SDPA forward": plain_sdpa, "(b) eager + output_attentions": eager_attentions,
             "(c) trace, capture only": capture_only, "(c+) (c), every array read": capture_and_read,
             "(d) trace + recompute + check": recompute_and_check,
             "sublayers": partial(sublayer_seconds, m, eager_attentions)}
    times = median_times(cases, args.repeats)
    a, b = times["(a) SDPA forward"], times["(b) eager + output_attentions"]
    times["(e) (b) + its attention sublayers"] = b + times.pop("sublayers")
    print(f"bench_trace: {args.texts} texts x {args.tokens} tokens, {m.name}, "
          f"torch threads {torch.get_num_threads()}, median of {args.repeats}")
    for name, t in times.items():
        print(f"  {name:32s} {t * 1000:8.1f} ms   x{t / a:5.2f} of (a)   x{t / b:5.2f} of (b)")
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"  peak RSS {peak_mib:.0f} MiB")
    c, d = times["(c) trace, capture only"], times["(d) trace + recompute + check"]
    print(f"  targets: (c)/(b) = {c / b:.2f} (<= 1.1: {'met' if c / b <= 1.1 else 'MISSED'}); "
          f"(d)/(b) = {d / b:.2f} (<= 1.5: {'met' if d / b <= 1.5 else 'MISSED'})")


if __name__ == "__main__":
    main()
