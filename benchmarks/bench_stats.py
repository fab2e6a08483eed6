"""Corpus statistics: throughput against two baselines, and memory against corpus size.

On the first 1,000 sentences of the UD English EWT dev set, with the bundled MiniLM:
  stats  `attnscope stats`: batch building, the forward with every metric and (CoNLL-U) the syntax,
         folding into the state; also measured on the same sentences as plain text (no syntax),
         and end to end (run(): reading, tokenizing, checkpoints)
  (a)    the plain SDPA forward over the same documents with the same batches, no statistics
  (b)    the script a user would write: per document an eager forward with output_attentions=True,
         then the same statistics in numpy (Clark et al.'s notebook style)
The machine is shared, so the three are timed batch by batch, back to back (best of --repeats
for (a) and stats); tokenizing is counted for both (a) and stats. The end-to-end run() is
reported too.
Peak RSS: `attnscope stats` in a fresh process on 200 and on 2,000 documents.
Targets: stats >= 0.8x (a), >= 2x (b); the two peaks within 10%.

Usage: .venv/bin/python benchmarks/bench_stats.py [--documents 1000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch

import attnscope
from attnscope.families import is_causal
from attnscope.stats import Document, Settings, Source, StatsState, new_state, run
from attnscope.stats.batching import Batch, Prepared, make_batch, plan, tokenize
from attnscope.stats.engine import run_batch
from corpus import ud_dev

UD_DEV = ud_dev()


def run_end_to_end(model: attnscope.Model, source: Source, settings: Settings) -> tuple[float, int]:
    """The whole run() as the CLI does it (reading, tokenizing, bucketing, metrics, syntax, checkpoints)."""
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        result = run(source, model, settings, Path(out) / "run")
        return time.perf_counter() - started, result.state.tokens


def sdpa_forward(model: attnscope.Model, batch: Batch) -> None:
    """(a): the plain forward with SDPA attention, no statistics."""
    with torch.no_grad():
        model.model(**batch.inputs)


def stats_forward(model: attnscope.Model, build: Callable[[], Batch], state: StatsState, settings: Settings) -> None:
    """stats: building the batch's unit maps, the forward with metrics and syntax, folding the state."""
    run_batch(model, build(), state, settings)


def naive_documents(model: attnscope.Model, group: list[Prepared]) -> None:
    for p in group:
        naive_document(model, p.doc)


def best_of(fn: Callable[[], None], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def paired(model: attnscope.Model, docs: list[Document], settings: Settings, repeats: int,
           with_naive: bool = True) -> dict[str, float]:
    """Seconds of (a), stats and (b) over the same batches, timed back to back batch by batch (the
    machine is shared: pairing keeps the load the same for the three)."""
    hf = model.model
    tok = model.tokenizer
    causal = is_causal(hf)
    state = new_state(model, settings, with_syntax=any(d.heads is not None for d in docs))
    seconds = {"sdpa": 0.0, "stats": 0.0, "naive": 0.0}
    started = time.perf_counter()
    prepared = tokenize(tok, docs, settings.max_length)  # shared by (a) and stats: counted for both
    shared = time.perf_counter() - started
    for idx in plan(prepared, settings.batch_size, settings.budget):
        group = [prepared[i] for i in idx]
        build = partial(make_batch, group, int(tok.pad_token_id or 0), settings.word_level, causal,
                        tok.cls_token_id, tok.sep_token_id)
        plain = build()
        hf.set_attn_implementation("sdpa")
        seconds["sdpa"] += best_of(partial(sdpa_forward, model, plain), repeats)
        hf.set_attn_implementation("eager")
        seconds["stats"] += best_of(partial(stats_forward, model, build, state, settings), repeats)
        if with_naive:
            seconds["naive"] += best_of(partial(naive_documents, model, group), 1)
    seconds["sdpa"] += shared
    seconds["stats"] += shared
    return seconds


def naive_document(model: attnscope.Model, doc: Document) -> dict[str, np.ndarray]:
    """(b), one document: eager forward with output_attentions, then numpy (token-level) statistics."""
    tok = model.tokenizer
    enc = tok(doc.text, return_tensors="pt", return_offsets_mapping=True)
    offsets = enc.pop("offset_mapping")[0].tolist()
    with torch.no_grad():
        out = model.model(**enc, output_attentions=True)
    attn = torch.stack(out.attentions)[:, 0].numpy().astype(np.float64)  # [layer, head, query, key]
    n = attn.shape[-1]
    strings = tok.convert_ids_to_tokens(enc["input_ids"][0])
    cls = np.array([s == "[CLS]" for s in strings], dtype=float)
    sep = np.array([s == "[SEP]" for s in strings], dtype=float)
    punct = np.array([s in (".", ",") for s in strings], dtype=float)
    stats = {
        "cls": (attn * cls).sum(-1).mean(-1), "sep": (attn * sep).sum(-1).mean(-1),
        "punct": (attn * punct).sum(-1).mean(-1),
        "self": (attn * np.eye(n)).sum(-1).mean(-1), "prev": (attn * np.eye(n, k=-1)).sum(-1).mean(-1),
        "next": (attn * np.eye(n, k=1)).sum(-1).mean(-1),
        "entropy": -(attn * np.log(np.where(attn > 0, attn, 1.0))).sum(-1).mean(-1),
        "distance": (attn * np.abs(np.arange(n)[:, None] - np.arange(n)[None])).sum(-1).mean(-1),
        "concentration": attn.max(-1).mean(-1),
    }
    if doc.words is not None:  # word-level maps and the most-attended word, as in Clark et al.'s notebook
        stats["syntax"] = naive_syntax(attn, offsets, doc)
    return stats


def naive_syntax(attn: np.ndarray, offsets: list[list[int]], doc: Document) -> np.ndarray:
    assert doc.words is not None and doc.heads is not None
    owner: list[int] = []  # the word of each character of "words joined by spaces"
    for w, form in enumerate(doc.words):
        owner += [w] * len(form) + [-1]
    groups: dict[int, list[int]] = {}
    for i, (a, b) in enumerate(offsets):
        groups.setdefault(owner[b - 1] if b > a else -1 - i, []).append(i)
    units = sorted(groups.values())
    word_attn = np.stack([attn[..., u].sum(-1) for u in units], -1)
    word_attn = np.stack([word_attn[..., u, :].mean(-2) for u in units], -2)[..., 1:-1, 1:-1]
    np.einsum("...ii->...i", word_attn)[...] = 0
    predicted = word_attn.argmax(-1) + 1  # [layer, head, word]
    gold = np.array(doc.heads)
    hits: np.ndarray = (predicted == gold).sum(-1)  # [layer, head]
    return hits


def peak_rss(documents: int) -> float:
    """Peak RSS (MiB) of a fresh process running `attnscope stats` on the first N UD dev sentences."""
    code = (
        "import resource, sys, tempfile\n"
        "from attnscope.cli.main import main\n"
        "with tempfile.TemporaryDirectory() as d:\n"
        f"    code = main(['stats', {str(UD_DEV)!r}, '--limit', '{documents}', '-o', d + '/run', '--no-progress'])\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=2, help="best of N per batch for (a) and stats")
    parser.add_argument("--no-rss", action="store_true")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = attnscope.load_model()
    source = Source(str(UD_DEV))
    docs = list(itertools.islice(source, args.documents))
    tokens = sum(len(p.ids) for p in tokenize(model.tokenizer, docs, 256))
    paired(model, docs[:64], Settings(), 1)  # warm up every path
    seconds = paired(model, docs, Settings(), args.repeats)
    # the same sentences as plain text: no trees, so no syntax (the statistics of any text corpus)
    text = paired(model, [Document(d.text, d.where) for d in docs], Settings(), args.repeats, with_naive=False)
    end_to_end, _ = run_end_to_end(model, source, Settings(limit=args.documents))
    report = {
        "documents": len(docs), "tokens": tokens, "threads": torch.get_num_threads(),
        "tokens_per_second": {k: round(tokens / v) for k, v in seconds.items()},
        "stats_end_to_end_tokens_per_second": round(tokens / end_to_end),
        "stats_vs_sdpa": round(seconds["sdpa"] / seconds["stats"], 3),
        "stats_vs_naive": round(seconds["naive"] / seconds["stats"], 3),
        "as_plain_text": {"tokens_per_second": {k: round(tokens / text[k]) for k in ("sdpa", "stats")},
                          "stats_vs_sdpa": round(text["sdpa"] / text["stats"], 3)},
        "targets": {"stats_vs_sdpa": ">= 0.8", "stats_vs_naive": ">= 2"},
    }
    print(json.dumps(report, indent=2), flush=True)
    if not args.no_rss:
        small, large = peak_rss(200), peak_rss(2000)
        report["peak_rss_mib"] = {"200": round(small, 1), "2000": round(large, 1),
                                  "ratio": round(large / small, 3), "target": "<= 1.10"}
        print(json.dumps(report["peak_rss_mib"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
