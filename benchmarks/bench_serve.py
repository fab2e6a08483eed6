"""Requests per second and latency of `attnscope serve` on the bundled model, at 32 and 256 tokens. (issue: Web app)

A real server (the CLI, on loopback, one worker, one torch thread) answers, from `--clients` concurrent clients:
  trace      POST /api/trace, weights as base64, a new text each time (a forward pass, recompute and check)
  page       POST /api/trace with the views payload, a new text each time (what the page asks for)
  explain    POST /api/explain on a cached text, a new layer/head/token each time (a click in the page)
The baseline, measured in this run: the same traces in this process (attnscope.trace + check, one torch
thread, no HTTP), so the server's own cost shows as a ratio. Texts are UD English dev sentences.

    .venv/bin/python benchmarks/bench_serve.py [--requests 24] [--clients 4]
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import httpx
import numpy as np
import torch

import attnscope
from corpus import ud_dev

UD_DEV = ud_dev()
TOKENS = (32, 256)


def texts_of(n_texts: int, tokens: int, tokenizer: Any, offset: int) -> list[str]:
    """n_texts distinct texts of at least `tokens` tokens (the server keeps the first `tokens`)."""
    sents = [line[9:].strip() for line in UD_DEV.read_text(encoding="utf-8").splitlines()
             if line.startswith("# text = ")]
    out, start = [], offset
    for _ in range(n_texts):
        words: list[str] = []
        while len(tokenizer(" ".join(words))["input_ids"]) < tokens:
            words.append(sents[start % len(sents)])
            start += 1
        out.append(" ".join(words))
    return out


def start_server() -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "attnscope.cli.main", "serve", "--port", "0", "--max-tokens", "256",
           "--max-chars", "20000", "--queue", "64"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        found = re.search(r"on (http://\S+/)", line)
        if found:
            return proc, found.group(1)
    raise SystemExit("attnscope serve did not start")


def timed(client: httpx.Client, path: str, body: dict[str, Any]) -> float:
    started = time.perf_counter()
    r = client.post(path, json=body)
    elapsed = time.perf_counter() - started
    if r.status_code != 200:
        raise SystemExit(f"{path} answered {r.status_code}: {r.text[:200]}")
    return elapsed


def load(url: str, path: str, bodies: list[dict[str, Any]], clients: int) -> dict[str, float]:
    """Send every body from `clients` threads; requests/s over the whole run, p50 and p95 latency."""
    with httpx.Client(base_url=url, timeout=300, limits=httpx.Limits(max_connections=clients)) as client:
        started = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            times = list(pool.map(lambda b: timed(client, path, b), bodies))
        wall = time.perf_counter() - started
    ms = np.array(times) * 1000
    return {"rps": len(bodies) / wall, "p50": float(np.percentile(ms, 50)), "p95": float(np.percentile(ms, 95))}


def in_process(texts: list[str], tokens: int, model: attnscope.Model) -> float:
    """Traces per second here: trace + check, as the server does for a new text."""
    def one(text: str) -> None:
        attnscope.trace(text, model=model, max_length=tokens).check()

    one(texts[0])  # warm-up
    times = []
    for text in texts:
        started = time.perf_counter()
        one(text)
        times.append(time.perf_counter() - started)
    return 1.0 / statistics.median(times)


def row(name: str, tokens: int, f: dict[str, float], base: float | None) -> str:
    ratio = f"{f['rps'] / base:5.2f}x" if base else "     -"
    return f"{name:<8} {tokens:>6} {f['rps']:>8.1f} {f['p50']:>8.0f} {f['p95']:>8.0f}   {ratio}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=24, help="requests per measurement (default 24)")
    ap.add_argument("--clients", type=int, default=4, help="concurrent clients (default 4)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("attnscope").setLevel(logging.ERROR)  # the texts run past max_length on purpose
    model = attnscope.load_model()
    proc, url = start_server()
    lines = []
    try:
        for tokens in TOKENS:
            base = in_process(texts_of(args.requests, tokens, model.tokenizer, 0), tokens, model)
            trace_bodies = [{"text": t, "max_length": tokens}
                            for t in texts_of(args.requests, tokens, model.tokenizer, 1000)]
            page_bodies = [{"text": t, "max_length": tokens, "stages": [], "payload": True}
                           for t in texts_of(args.requests, tokens, model.tokenizer, 2000)]
            cached = page_bodies[0]["text"]
            explain_bodies = [{"text": cached, "max_length": tokens, "layer": i % 6, "head": (5 * i) % 12,
                               "token": (7 * i) % tokens} for i in range(args.requests)]
            lines.append(f"in-proc  {tokens:>6} {base:>8.1f}        -        -    1.00x")
            lines.append(row("trace", tokens, load(url, "/api/trace", trace_bodies, args.clients), base))
            lines.append(row("page", tokens, load(url, "/api/trace", page_bodies, args.clients), base))
            lines.append(row("explain", tokens, load(url, "/api/explain", explain_bodies, args.clients), None))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(f"attnscope serve, bundled all-MiniLM-L6-v2, 1 worker, {args.clients} clients, {args.requests} requests each")
    print(f"{'request':<8} {'tokens':>6} {'req/s':>8} {'p50 ms':>8} {'p95 ms':>8}   vs in-process traces/s")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
