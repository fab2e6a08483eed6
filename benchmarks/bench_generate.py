"""Cost of tracing a generation, as ratios to plain `model.generate` of the same model in the same run.

    .venv/bin/python benchmarks/bench_generate.py [--new-tokens 64] [--prompt-tokens 32] [--repeat 2]

SmolLM2-135M (the real model, eager attention, float32, CPU), greedy, its end-of-sequence token switched
off so every run writes exactly --new-tokens tokens. Times (best of --repeat): plain model.generate with
the same KV cache; attnscope.generate with verify=False (tracing); and the verification on its own
(attnscope.generate with verify=True, minus tracing). Times are the process's CPU seconds with one torch
thread, so that other work on a shared machine does not count. Then the peak RSS of a fresh process at 32 and 128
new tokens, plain and traced: the trace's extra memory should follow the attention rows it keeps
(~ layers x heads x tokens^2 x 4 bytes), not copies of the cache at every step. (Peaks are
measured above the RSS of the loaded model: Linux only.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import attnscope
from attnscope.tracing.decoding import generate

TEXT = ("The history of the city begins with a small settlement on the river, where traders met to exchange "
        "grain, salt and cloth. Over the centuries the market grew into a town, and the town into a city "
        "with walls, churches and a university that drew students from every corner of the country.")


def load() -> attnscope.Model:
    m = attnscope.load_model("smollm2")
    m.model.generation_config.eos_token_id = None  # write exactly max_new_tokens tokens, traced or not
    return m


def prompt_of(m: attnscope.Model, n_tokens: int) -> str:
    ids = m.tokenizer(TEXT)["input_ids"][:n_tokens]
    return str(m.tokenizer.decode(ids))


def best_of(fn: Callable[[], object], repeat: int) -> float:
    """The least CPU time of this process over repeat runs: on a shared machine wall time measures the
    neighbours (one torch thread, so CPU time is the work itself)."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return min(times)


def plain(m: attnscope.Model, prompt: str, n: int) -> None:
    enc = m.tokenizer(prompt, return_tensors="pt")
    lm: Any = m.model  # a causal LM: generate() is transformers' GenerationMixin
    with torch.no_grad():
        out = lm.generate(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                               max_new_tokens=n, do_sample=False, pad_token_id=m.tokenizer.eos_token_id)
    assert out.shape[1] == enc["input_ids"].shape[1] + n


def _status_mib(field: str) -> float:
    """VmRSS or VmHWM (peak) of this process from /proc, in MiB."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise LookupError(field)


def peak_rss_child(n: int, traced: bool, prompt_tokens: int) -> None:
    """In a fresh process: the peak RSS (MiB) of one generation above the RSS before it, and the trace's bytes.

    Loading the model peaks higher than generating, so the peak is reset first (Linux: clear_refs 5)."""
    m = load()
    prompt = prompt_of(m, prompt_tokens)
    plain(m, prompt, 1)  # load every lazy part of the stack before the measured run
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = _status_mib("VmRSS")
    kept = 0
    if traced:
        g = generate(prompt, model=m, max_new_tokens=n, verify=False)
        kept = sum(g.trace.arrays[s].nbytes for s in ("x", "q", "k", "v", "weights", "context", "output"))
    else:
        plain(m, prompt, n)
    print(json.dumps({"rss_mib": _status_mib("VmHWM") - before, "kept_mib": kept / 2**20}))


def peak_rss(n: int, traced: bool, prompt_tokens: int) -> dict[str, float]:
    done = subprocess.run([sys.executable, __file__, "--rss-child", str(n), "--prompt-tokens", str(prompt_tokens),
                           *(["--traced"] if traced else [])], capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: CPU time is then the work)")
    ap.add_argument("--no-rss", action="store_true", help="skip the peak RSS runs (four fresh processes)")
    ap.add_argument("--rss-only", action="store_true", help="only the peak RSS runs")
    ap.add_argument("--rss-child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.rss_child is not None:
        peak_rss_child(args.rss_child, args.traced, args.prompt_tokens)
        return
    if args.rss_only:
        rss_lines(args.prompt_tokens)
        return
    m = load()
    prompt, n = prompt_of(m, args.prompt_tokens), args.new_tokens
    n_prompt = len(m.tokenizer(prompt)["input_ids"])
    plain(m, prompt, 4)  # warm up
    say(f"SmolLM2-135M, greedy, {n_prompt}-token prompt, {n} new tokens, eager attention, "
        f"{torch.get_num_threads()} torch thread(s), CPU seconds (best of {args.repeat})")
    t_plain = best_of(lambda: plain(m, prompt, n), args.repeat)
    say(f"  plain model.generate          {t_plain:7.2f} s   1.00x")
    t_traced = best_of(lambda: generate(prompt, model=m, max_new_tokens=n, verify=False), args.repeat)
    say(f"  traced (attnscope.generate)   {t_traced:7.2f} s   {t_traced / t_plain:.2f}x   (target <= 1.3x)")
    t_verified = best_of(lambda: generate(prompt, model=m, max_new_tokens=n, verify=True), args.repeat)
    say(f"  verification alone            {t_verified - t_traced:7.2f} s   {(t_verified - t_traced) / t_plain:.2f}x")
    if not args.no_rss:
        rss_lines(args.prompt_tokens)


def rss_lines(prompt_tokens: int) -> None:
    for count in (32, 128):
        base, traced = peak_rss(count, False, prompt_tokens), peak_rss(count, True, prompt_tokens)
        say(f"  peak RSS of generating {count:3d} new tokens, above the loaded model: plain "
            f"{base['rss_mib']:6.1f} MiB, traced {traced['rss_mib']:6.1f} MiB (the trace's arrays: "
            f"{traced['kept_mib']:.1f} MiB)")


def say(line: str) -> None:
    print(line, flush=True)

if __name__ == "__main__":
    main()
