"""How much does tracing cost next to a plain forward pass? (issues: Core, 12)

On the bundled MiniLM (8 texts x 256 tokens), SmolLM2-135M and Gemma 3 270M (4 texts x 256 tokens each), in one
process:
  (a) plain forward with SDPA            (b) eager forward with output_attentions=True
  (c) attnscope.trace, capture only       (d) attnscope.trace with recompute, then check()
Prints the median and fastest time of each, the ratios to (a) and (b), the median of each case's minor page
faults per round (memory the allocator had given back to the system and asks for again: a case pays for what the
cases before it freed, and for the arrays it keeps), and the peak RSS.
Targets: (c) <= 1.1x (b); (d) <= 1.6x (b) (the issue-12 target; MiniLM had 1.5x before).

A trace's arrays are laid out [layer, ...] per text when first read (check() reads none), so
two more lines show what (c) leaves for later and what bounds (d) from below:
  (c+) (c), then every array of every trace read once
  (e)  (b) plus the time its own attention sublayers took (the self-attention modules and the
       output projections, timed with hooks inside (b)): a recompute as fast as the model's own
       code, with no comparison at all, would cost this much
Every forward pass runs the transformer without its LM head (Model.base), as trace does.

    .venv/bin/python benchmarks/bench_trace.py [--repeats 9] [--models minilm,smollm2,gemma3] [--texts 8]
        [--smollm2-texts 4] [--tokens 256] [--threads 1] [--clock wall|cpu] [--allocator keep|system]

--clock cpu times the process's CPU seconds instead of the wall clock: on a shared machine whose load
exceeds its cores, a wall-clock ratio measures the queue as much as the code.
--allocator keep (the default) makes glibc keep the memory it frees (mallopt), as a process that traces text after
text does: no case then pays for another's memory. With --allocator system, glibc's own policy, (d)'s forward paid
0-57k page faults per round for memory that (c+) and (c) gave back, up to ~0.15x (b), while (b), run after the
small (a), paid none; a process that only traces (no (c+) between) paid none either (docs/check-speed.md, round 8).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import resource
import statistics
import time
from collections.abc import Callable
from functools import partial

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch
from transformers import AutoModel, AutoModelForCausalLM

import attnscope
from attnscope import families
from corpus import ud_dev

UD_DEV = ud_dev()
B, D = "(b) eager + output_attentions", "(d) trace + recompute + check"
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]
allocator = "system"  # glibc's policy for freed memory: "keep" with --allocator keep (see keep_freed_memory)


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


def attention_sublayers(m: attnscope.Model) -> list[torch.nn.Module]:
    """Each layer's attention module, and its output projection when that lives outside it (BERT)."""
    fam = families.family_of(m.model)
    assert fam is not None, f"{m.architecture}: no family adapter"
    mods = []
    for mod in families.attention_modules(m.model):
        proj = fam.out_proj(families.base_of(m.model), mod)
        mods += [mod] if any(sub is proj for sub in mod.modules()) else [mod, proj]
    return mods


def sublayer_seconds(m: attnscope.Model, forward: Callable[[], object]) -> float:
    """Seconds the forward spends in its self-attention modules and attention output projections."""
    spent = [0.0]
    started: list[float] = []
    hooks = []
    for mod in attention_sublayers(m):
        hooks.append(mod.register_forward_pre_hook(lambda *_: started.append(clock())))
        hooks.append(mod.register_forward_hook(
            lambda *_: spent.__setitem__(0, spent[0] + clock() - started.pop())))
    try:
        forward()
    finally:
        for h in hooks:
            h.remove()
    return spent[0]


FAULTS: dict[str, list[int]] = {}  # case -> minor page faults in each round (memory the allocator asked anew)


def round_robin(cases: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Seconds of each case in each round, the cases run round-robin so that a noisy machine weighs on all
    alike. A case that returns a float reports that many seconds itself. Each round's minor page faults go
    to FAULTS: a case pays them for memory the case before it gave back to the system."""
    for fn in cases.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t = clock()
            out = fn()
            times[name].append(out if isinstance(out, float) else clock() - t)
            FAULTS.setdefault(name, []).append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
            # freed before the next case starts: kept until `out` is bound again, (c)'s traces (their captured
            # arrays, ~0.2 GB for MiniLM) were alive through all of (d), which then asked the system for fresh memory
            del out
    return times


def sdpa_twin(m: attnscope.Model) -> torch.nn.Module:
    """The same checkpoint with PyTorch's fused attention (SDPA), without its head, for line (a)."""
    auto = AutoModelForCausalLM if m.model is not m.base else AutoModel
    twin: torch.nn.Module = auto.from_pretrained(str(m.model.name_or_path), attn_implementation="sdpa",
                                                 dtype=torch.float32)
    base: torch.nn.Module = getattr(twin, "base_model", twin)
    return base.eval()


def bench_model(m: attnscope.Model, n_texts: int, tokens: int, repeats: int) -> dict[str, list[float]]:
    """Seconds of (a) to (e) in each round, on n_texts texts of `tokens` tokens each."""
    sdpa = sdpa_twin(m)
    texts = long_texts(n_texts, tokens, m.tokenizer)
    enc = m.tokenizer(texts, max_length=tokens, truncation=True, padding=True, return_tensors="pt")
    assert enc["input_ids"].shape == (n_texts, tokens)
    worst: list[str] = []

    def plain_sdpa() -> object:
        with torch.no_grad():
            return sdpa(**enc)

    def eager_attentions() -> object:
        with torch.no_grad():
            return m.base(**enc, output_attentions=True)

    def capture_only() -> object:
        return attnscope.trace(texts, model=m, max_length=tokens, recompute=False)

    def capture_and_read() -> object:
        traces = attnscope.trace(texts, model=m, max_length=tokens, recompute=False)
        return [[t.arrays[s] for s in t.arrays] for t in traces]

    def recompute_and_check() -> object:
        reports = [t.check() for t in attnscope.trace(texts, model=m, max_length=tokens)]
        worst[:] = [f"{r.status} {r.max_error:.1e}" for r in reports]
        return reports

    # (c+) first in each round: it lays out every array (GBs for SmolLM2), and what it frees goes back to the
    # system, so the case after it pays page faults for its forward pass (18k-61k on (d), up to 0.2x (b)); (b)
    # follows (a) and (d) follows (c), both forwards whose outputs are dropped alike
    cases: dict[str, Callable[[], object]] = {
        "(c+) (c), every array read": capture_and_read,
        "(a) SDPA forward": plain_sdpa, "(b) eager + output_attentions": eager_attentions,
        "(c) trace, capture only": capture_only, "(d) trace + recompute + check": recompute_and_check,
        "sublayers": partial(sublayer_seconds, m, eager_attentions)}
    ran = round_robin(cases, repeats)
    ran["(e) (b) + its attention sublayers"] = [b + s for b, s in zip(ran[B], ran.pop("sublayers"), strict=True)]
    order = ("(a) SDPA forward", B, "(c) trace, capture only", "(c+) (c), every array read", D,
             "(e) (b) + its attention sublayers")
    times = {name: ran[name] for name in order}
    print(f"bench_trace: {n_texts} texts x {tokens} tokens, {m.name} ({m.architecture}), "
          f"torch threads {torch.get_num_threads()}, {clock.__name__}, allocator {allocator}, {repeats} rounds, "
          f"load average {os.getloadavg()[0]:.1f}; checks: {', '.join(worst)}")
    return times


def print_times(rounds: dict[str, list[float]]) -> None:
    """Each case's median and fastest round, and the ratios the targets are about, three ways: of the medians,
    the median of each round's own ratio (cases of one round ran seconds apart: the machine's drift cancels),
    and of the fastest rounds (timeit's rule: what the other processes did not slow down)."""
    med = {name: statistics.median(ts) for name, ts in rounds.items()}
    low = {name: min(ts) for name, ts in rounds.items()}
    a, b = med["(a) SDPA forward"], med[B]
    print(f"  {'':34s} {'median':>8s}                                 {'fastest':>8s}   {'page faults':>11s}")
    for name, t in med.items():
        faults = FAULTS.pop(name, None)
        print(f"  {name:34s} {t * 1000:8.1f} ms   x{t / a:5.2f} of (a)   x{t / b:5.2f} of (b)   "
              f"{low[name] * 1000:8.1f} ms   x{low[name] / low[B]:5.2f} of (b)   "
              f"{'' if faults is None else f'{statistics.median(faults):11.0f}'}")
    for label, limit, case in (("(c)/(b)", 1.1, "(c) trace, capture only"), ("(d)/(b)", 1.6, D)):
        per_round = [x / y for x, y in zip(rounds[case], rounds[B], strict=True)]
        ratios = (med[case] / b, statistics.median(per_round), low[case] / low[B])
        verdicts = ", ".join(f"{r:.2f} {'met' if r <= limit else 'MISSED'}" for r in ratios)
        print(f"  target {label} <= {limit}: {verdicts} (of the medians, median of the rounds' ratios, of the fastest)")
        if len(per_round) >= 4:  # how far one round's ratio strays: the spread a single round would show
            q1, _, q3 = statistics.quantiles(per_round, n=4)
            print(f"    rounds' ratios: quartiles {q1:.2f}-{q3:.2f}, {sum(r <= limit for r in per_round)} of "
                  f"{len(per_round)} rounds <= {limit}")
        interval = median_interval(per_round)
        if interval is not None:  # where the median of the rounds' ratios lies, given this run's spread
            lo, hi, level = interval
            print(f"    median of the rounds' ratios: {level:.0%} confidence interval {lo:.2f}-{hi:.2f} "
                  f"({'all' if hi <= limit else 'part' if lo <= limit else 'none'} of it <= {limit})")
    e = "(e) (b) + its attention sublayers"
    print(f"  floor (e)/(b): {med[e] / b:.2f}, {low[e] / low[B]:.2f}")


def median_interval(xs: list[float], level: float = 0.95) -> tuple[float, float, float] | None:
    """A distribution-free confidence interval for the median of xs: order statistics j and n + 1 - j, with j the
    largest such that P(Binomial(n, 1/2) < j) <= (1 - level) / 2 (so no assumption on the rounds' distribution,
    only that rounds are independent). Returns (low, high, the interval's exact coverage); None below 6 rounds."""
    n, tail = len(xs), (1 - level) / 2
    below = [math.comb(n, i) / 2**n for i in range(n + 1)]  # P(Binomial(n, 1/2) = i)
    j = 0
    while j < n // 2 and sum(below[: j + 1]) <= tail:
        j += 1
    if j == 0:
        return None
    ordered = sorted(xs)
    return ordered[j - 1], ordered[n - j], 1 - 2 * sum(below[:j])


def keep_freed_memory() -> str:
    """glibc: never give the heap's freed top back, and serve every size from the heap (mallopt). Returns the
    allocator policy in effect: "keep", or "system" where there is no glibc mallopt (macOS, musl)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return "system"
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    # every size from the heap (1 GB); where glibc refuses that, its documented largest, 32 MB on 64-bit
    kept = hasattr(libc, "mallopt") and libc.mallopt(m_trim_threshold, 2**31 - 1) == 1 and (
        libc.mallopt(m_mmap_threshold, 2**30) == 1 or libc.mallopt(m_mmap_threshold, 2**25) == 1)
    return "keep" if kept else "system (no glibc mallopt here)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--models", default="minilm,smollm2,gemma3", help="comma-separated: minilm, smollm2, gemma3")
    ap.add_argument("--texts", type=int, default=8, help="MiniLM texts (default 8)")
    ap.add_argument("--smollm2-texts", type=int, default=4, help="SmolLM2 and Gemma 3 texts (default 4)")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: on a shared 2-core machine two threads spin on each other)")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="wall (default) or cpu: the process's CPU time, steadier on a loaded machine")
    ap.add_argument("--allocator", choices=("keep", "system"), default="keep",
                    help="keep (default): glibc keeps what it frees, as in a process that traces text after text, so "
                         "no case pays for another's frees; system: glibc's own policy, which gives freed memory back, "
                         "so a case pays page faults for what the cases before it freed")
    args = ap.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    global allocator
    allocator = keep_freed_memory() if args.allocator == "keep" else "system"
    torch.set_num_threads(args.threads)
    logging.getLogger("attnscope").setLevel(logging.ERROR)  # texts are longer than --tokens on purpose
    for name in args.models.split(","):
        n_texts = args.texts if name == "minilm" else args.smollm2_texts
        print_times(bench_model(attnscope.load_model(name), n_texts, args.tokens, args.repeats))
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak_mib:.0f} MiB")


if __name__ == "__main__":
    main()
