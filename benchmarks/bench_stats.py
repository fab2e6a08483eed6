"""Corpus statistics: throughput against two baselines, and memory against corpus size.

On the first 1,000 sentences of the UD English EWT dev set, with the bundled MiniLM:
  stats  `attnscope stats` (the engine's run(): reading, tokenizing, bucketing, metrics, syntax,
         checkpoints)
  (a)    the plain SDPA forward over the same documents with the same batches, no statistics
  (b)    the script a user would write: per document an eager forward with output_attentions=True,
         then the same statistics in numpy (Clark et al.'s notebook style)
Runs are interleaved and repeated (the machine is shared); the ratios are medians.
Peak RSS: `attnscope stats` in a fresh process on 200 and on 2,000 documents.
Targets: stats >= 0.8x (a), >= 2x (b); the two peaks within 10%.

Usage: .venv/bin/python benchmarks/bench_stats.py [--documents 1000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import attnscope
from attnscope.stats import Document, Settings, Source, run
from attnscope.stats.batching import plan, tokenize

UD_DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "ud-english-ewt" / "en_ewt-ud-dev.conllu"


def bench_stats(model: attnscope.Model, source: Source, settings: Settings) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        result = run(source, model, settings, Path(out) / "run")
        return time.perf_counter() - started, result.state.tokens


def bench_sdpa(model: attnscope.Model, source: Source, settings: Settings) -> tuple[float, int]:
    """(a): the same reading, tokenizing and length buckets, then only the SDPA forward."""
    hf = model.model
    before = hf.config._attn_implementation
    hf.set_attn_implementation("sdpa")
    try:
        started = time.perf_counter()
        docs = list(itertools.islice(source, settings.limit))
        tokens = 0
        for start in range(0, len(docs), settings.chunk_documents):
            prepared = tokenize(model.tokenizer, docs[start:start + settings.chunk_documents], settings.max_length)
            for idx in plan(prepared, settings.batch_size, settings.budget):
                ids = [prepared[i].ids for i in idx]
                width = max(map(len, ids))
                input_ids = torch.zeros((len(ids), width), dtype=torch.long)
                mask = torch.zeros((len(ids), width), dtype=torch.long)
                for row, seq in enumerate(ids):
                    input_ids[row, : len(seq)] = torch.tensor(seq)
                    mask[row, : len(seq)] = 1
                with torch.no_grad():
                    hf(input_ids=input_ids, attention_mask=mask)
                tokens += sum(map(len, ids))
        return time.perf_counter() - started, tokens
    finally:
        hf.set_attn_implementation(before)


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
    return (predicted == gold).sum(-1)


def bench_naive(model: attnscope.Model, source: Source, settings: Settings) -> tuple[float, int]:
    started = time.perf_counter()
    totals: dict[str, np.ndarray] = {}
    tokens = 0
    for doc in itertools.islice(source, settings.limit):
        for k, v in naive_document(model, doc).items():
            totals[k] = totals.get(k, 0) + v
        tokens += len(model.tokenizer(doc.text)["input_ids"])
    return time.perf_counter() - started, tokens


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
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-rss", action="store_true")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = attnscope.load_model()
    source = Source(str(UD_DEV))
    settings = Settings(limit=args.documents)
    bench_stats(model, source, Settings(limit=64))  # warm up the kernels of both paths
    bench_sdpa(model, source, Settings(limit=64))
    rows: dict[str, list[float]] = {"stats": [], "sdpa": [], "naive": []}
    for _ in range(args.repeats):
        for name, fn in (("sdpa", bench_sdpa), ("stats", bench_stats), ("naive", bench_naive)):
            seconds, tokens = fn(model, source, settings)
            rows[name].append(tokens / seconds)
            print(f"  {name:6s} {tokens} tokens in {seconds:6.2f} s: {tokens / seconds:8.0f} tokens/s", flush=True)
    vs_sdpa = statistics.median(s / a for s, a in zip(rows["stats"], rows["sdpa"], strict=True))
    vs_naive = statistics.median(s / b for s, b in zip(rows["stats"], rows["naive"], strict=True))
    report = {
        "documents": args.documents, "threads": torch.get_num_threads(),
        "tokens_per_second": {k: round(statistics.median(v)) for k, v in rows.items()},
        "stats_vs_sdpa": round(vs_sdpa, 3), "stats_vs_naive": round(vs_naive, 3),
        "targets": {"stats_vs_sdpa": ">= 0.8", "stats_vs_naive": ">= 2"},
    }
    if not args.no_rss:
        small, large = peak_rss(200), peak_rss(2000)
        report["peak_rss_mib"] = {"200": round(small, 1), "2000": round(large, 1),
                                  "ratio": round(large / small, 3), "target": "<= 1.10"}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
