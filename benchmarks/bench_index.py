"""Corpus index (issue 33): build speed against the plain forward, search latency and recall at scale, memory and
disk per token.

(1) Build speed, on the first --documents sentences of the UD slice with the bundled MiniLM: `build_index` (every
    layer, every head: q, k, context, embedding and attention summary written to disk; no approximate index)
    against the plain forward (the model's own attention, no capture, no hidden states) over the same batches
    (attnscope.stats.batching, tokenizing counted for both). Best of --repeats. Target: >= 0.7x.
(2) Search at --tokens tokens (default 1,000,000): the corpus is made from the bundled sentences, each document the
    sentence i followed by the sentence (i + step) mod 500 for step = 1, 2, ... (every pair is a new context, so
    every token's vector is a new one), indexed at layer 3 (head 0: the least build_index keeps) with the FAISS index
    of the embeddings. Corpus and index are built once in --cache-dir (a killed build resumes there; the build's
    seconds and peak RSS are kept beside it). 200 queries (stored vectors plus Gaussian noise of 0.05 per
    coordinate): exact (float64, the reference; 10 of them timed) and approximate latency p50/p95 and recall@10 at
    each --ef efSearch. Target: p95 < 50 ms at recall@10 >= 0.95.
(3) Peak RSS of this process after each part; bytes on disk per token (arrays; approximate index); the FAISS
    index's resident memory once read (RSS before and after).
(4) --engine ray (--parts ray): the build of (1) on the same sentences, local against engine="ray" with 1 and 2
    workers on a local Ray runtime, every model process on --threads torch threads; seconds counted from the moment
    the workers have loaded the model (bench_ray.WorkersReady) and wall seconds with their start; every Ray index
    checked byte for byte equal to the local one (arrays, documents, manifest). Best of --repeats.

Usage: .venv/bin/python benchmarks/bench_index.py [--documents 500] [--tokens 1000000] [--repeats 2] [--keep DIR]
                                                  [--parts build,search,ray] [--threads 1]
                                                  [--cache-dir /tmp/attnscope-bench-index] [--ef 64,128,256]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import attnscope
from attnscope.corpus import ann as ann_lib
from attnscope.corpus.index import BuildResult, build_index
from attnscope.corpus.search import exact_search, find, vectors
from attnscope.corpus.store import CorpusIndex
from attnscope.corpus.tags import TaggedSource
from attnscope.stats.batching import batches, chunks
from attnscope.stats.settings import Settings
from attnscope.stats.sources import Source
from corpus import ud_dev


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def plain_forward(model: attnscope.Model, source: Source, settings: Settings) -> tuple[float, int]:
    """Seconds and tokens of the plain forward over the build's batches (tokenizing included)."""
    tokens, start = 0, time.perf_counter()
    with torch.inference_mode():
        for chunk in chunks(source, settings.limit, settings.chunk_documents):
            for batch in batches(model, chunk, settings):
                model.base(**batch.inputs)
                tokens += batch.tokens
    return time.perf_counter() - start, tokens


def build_speed(model: attnscope.Model, documents: int, repeats: int, work: Path) -> None:
    settings = Settings(limit=documents, batch_size=32, checkpoint_every=10**6)
    source = TaggedSource(str(ud_dev()))
    plain, built = [], []
    for r in range(repeats):
        plain.append(plain_forward(model, source, settings)[0])
        start = time.perf_counter()
        result = build_index(source, work / f"speed{r}", model, settings=settings, ann=())
        built.append(time.perf_counter() - start)
    disk = sum(p.stat().st_size for p in (work / "speed0").rglob("*") if p.is_file())
    print(f"(1) {documents} sentences, {result.tokens:,} tokens, all {model.n_layers} layers and {model.n_heads} heads")
    print(f"    plain forward {min(plain):.2f} s ({result.tokens / min(plain):,.0f} tokens/s); index build "
          f"{min(built):.2f} s ({result.tokens / min(built):,.0f} tokens/s): {min(plain) / min(built):.2f}x "
          f"(target >= 0.7x); runs: plain {', '.join(f'{t:.2f}' for t in plain)}, build "
          f"{', '.join(f'{t:.2f}' for t in built)}")
    print(f"    disk {disk / result.tokens:,.0f} bytes per token (every layer and head); "
          f"peak RSS {peak_rss_mb():,.0f} MB")


def pairs_corpus(path: Path, tokens: int, model: attnscope.Model) -> int:
    """Write documents of sentence pairs until about `tokens` tokens (once: a cached file is kept); returns the
    number of documents. Document n is sentence i followed by sentence (i + step) mod 500 for step = 1, 2, ...
    (i = n mod 500): every pair is a new context, so every token's vector is a new one."""
    if path.is_file():
        with path.open(encoding="utf-8") as cached:
            return sum(1 for _ in cached)
    sentences = [d.text for d in Source(str(ud_dev()))]
    lengths = [len(model.tokenizer(s)["input_ids"]) - 2 for s in sentences]  # without [CLS] and [SEP]
    total = n = 0
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as out:
        for step in range(1, len(sentences)):
            for i, s in enumerate(sentences):
                if total >= tokens:
                    break
                j = (i + step) % len(sentences)
                out.write(f"{s} {sentences[j]}\n")
                total += lengths[i] + lengths[j] + 2
                n += 1
    os.replace(tmp, path)
    return n


def rss_mb() -> float:
    """This process's resident memory now, in MB."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def cached_build(model: attnscope.Model, tokens: int, cache: Path) -> tuple[Path, int, dict[str, Any]]:
    """The 1M-token index in cache/pairs-TOKENS (built, resumed, or found there) and its build's figures: seconds
    (summed over resumed runs), the building process's peak RSS and the sentences it pairs (another set of
    sentences, ATTNSCOPE_UD_DEV, needs another cache)."""
    root = cache / f"pairs-{tokens}"
    root.mkdir(parents=True, exist_ok=True)
    sentences = str(ud_dev())
    stats = root / "build-stats.json"
    figures = json.loads(stats.read_text()) if stats.is_file() else {"seconds": 0.0, "peak_rss_mb": 0.0}
    if figures.setdefault("sentences", sentences) != sentences:
        raise SystemExit(f"{root} was built from {figures['sentences']}: choose another --cache-dir for {sentences}")
    n = pairs_corpus(root / "pairs.txt", tokens, model)
    result = build_index(Source(str(root / "pairs.txt")), root / "index", model, layers=[3], heads=[0],
                         settings=Settings(batch_size=32, checkpoint_every=50), ann=("embedding",), resume=True)
    if result.seconds > 0:  # this run built (part of) it
        figures = {"seconds": figures["seconds"] + result.seconds, "sentences": sentences,
                   "peak_rss_mb": max(figures["peak_rss_mb"], peak_rss_mb()), "tokens": result.tokens}
        stats.write_text(json.dumps(figures))
    return root / "index", n, figures


def search_at_scale(model: attnscope.Model, tokens: int, cache: Path, efs: list[int]) -> None:
    path, n, built = cached_build(model, tokens, cache)
    index = CorpusIndex(path, verify=False)
    count = index.manifest["corpus"]["tokens"]
    arrays = sum(p.stat().st_size for p in (path / "arrays").iterdir())
    embedding = index.array("embedding.l3").nbytes
    faiss_bytes = sum(p.stat().st_size for p in (path / "ann").iterdir())
    print(f"(2) {n:,} documents (pairs of the bundled sentences), {count:,} tokens, layer 3, head 0; built in "
          f"{built['seconds']:,.0f} s with the FAISS index of the embeddings (peak RSS {built['peak_rss_mb']:,.0f} MB)"
          f"; cached in {path}")
    print(f"    disk per token: arrays {arrays / count:,.0f} bytes (layer 3: embedding {embedding / count:,.0f}, "
          f"context, q and k of head 0, summary), FAISS {faiss_bytes / count:,.0f} bytes")
    data = vectors(index, "embedding", 3, None)
    rng = np.random.default_rng(0)
    queries = np.stack([np.asarray(data[r]) + rng.normal(0, 0.05, data.shape[1])
                        for r in rng.choice(len(data), 200, replace=False)])  # [query, d_model]
    truth = top10(data, queries)
    before = rss_mb()
    find(index, queries[0], layer=3)  # the FAISS file read once, as a server would keep it
    loaded = rss_mb() - before
    exact = []
    for i, q in enumerate(queries[:10]):  # exact search reads every vector: timed on 10 queries
        t0 = time.perf_counter()
        rows, _ = exact_search(data, q, 10)
        exact.append(time.perf_counter() - t0)
        assert set(rows.tolist()) == set(truth[i].tolist())
    print(f"    memory: the FAISS index in RAM {loaded:,.0f} MB ({loaded * 2**20 / count:,.0f} bytes per token); "
          f"exact search maps the embeddings ({embedding / count:,.0f} bytes per token, read from the page cache); "
          f"RSS now {rss_mb():,.0f} MB, peak {peak_rss_mb():,.0f} MB")
    print(f"    {'search':34s} {'p50':>9s} {'p95':>9s} {'recall@10':>9s}")
    print(f"    {'exact (float64, 10 queries)':34s} {ms(exact, 50)} {ms(exact, 95)} {'1 (ref.)':>9s}")
    default = ann_lib.EF_SEARCH
    for ef in efs:
        ann_lib.EF_SEARCH = ef  # efSearch for this row's searches (find reads it per call)
        times, recalls = [], []
        for i, q in enumerate(queries):
            t1 = time.perf_counter()
            found, _, _ = find(index, q, layer=3, k=10)
            times.append(time.perf_counter() - t1)
            recalls.append(len(set(truth[i].tolist()) & set(found.tolist())) / 10)
        name = f"FAISS M {ann_lib.CONNECTIONS}, efSearch {ef}" + (" (default)" if ef == default else "")
        print(f"    {name:34s} {ms(times, 50)} {ms(times, 95)} {np.mean(recalls):9.3f}")
    ann_lib.EF_SEARCH = default
    print("    (200 queries: stored embeddings plus Gaussian noise of 0.05 per coordinate; target p95 < 50 ms at "
          f"recall@10 >= 0.95; load average {os.getloadavg()[0]:.1f})")


def ms(seconds: list[float], q: int) -> str:
    return f"{np.percentile(seconds, q) * 1000:6.2f} ms"


def top10(data: np.ndarray, queries: np.ndarray, rows: int = 65536) -> np.ndarray:
    """The exact 10 nearest rows by cosine distance for every query at once, in float64 (exact_search's
    definition, one pass over the vectors for all queries). -> [query, 10]"""
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    best = np.full((len(q), 10), -1, dtype=np.int64)
    best_d = np.full((len(q), 10), np.inf)
    for start in range(0, len(data), rows):
        chunk = np.asarray(data[start:start + rows], dtype=np.float64)
        d = 1.0 - (q @ chunk.T) / np.linalg.norm(chunk, axis=1)  # [query, rows]
        all_d = np.concatenate([best_d, d], axis=1)
        all_rows = np.concatenate([best, np.broadcast_to(np.arange(start, start + len(chunk)), d.shape)], axis=1)
        keep = np.argsort(all_d, axis=1, kind="stable")[:, :10]
        best_d, best = np.take_along_axis(all_d, keep, 1), np.take_along_axis(all_rows, keep, 1)
    return best


def same_files(a: Path, b: Path) -> bool:
    """Every file of two index directories byte for byte."""
    names = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    if names != sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file()):
        return False
    return all((a / n).read_bytes() == (b / n).read_bytes() for n in names)


def ray_speed(model: attnscope.Model, documents: int, repeats: int, threads: int) -> None:
    """(4): the build of (1), local against engine="ray" with 1 and 2 workers (see the module's docstring)."""
    from bench_ray import engines

    settings = Settings(limit=documents, batch_size=32, checkpoint_every=10**6)

    def one(out: Path, where: dict[str, Any]) -> tuple[BuildResult, Path]:
        return build_index(TaggedSource(str(ud_dev())), out, model, settings=settings, ann=(), **where), out

    local, steady, wall, ray_start = engines(argparse.Namespace(repeats=repeats, threads=threads), one,
                                             lambda a, b: same_files(a[1], b[1]))
    tokens = local[0].tokens
    print(f"(4) --engine ray: {documents} sentences, {tokens:,} tokens, all layers and heads, {threads} torch "
          f"thread(s) per model process, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; Ray runtime "
          f"start {ray_start:.1f} s; every Ray index byte for byte the local one")
    for name in steady:
        print(f"    {name:6s} {steady[name]:7.2f} s after the workers were ready ({tokens / steady[name]:,.0f} "
              f"tokens/s), {wall[name]:7.2f} s wall with their start")
    print(f"    speed-up of 2 workers over local: {steady['local'] / steady['ray:2']:.2f}x once ready, "
          f"{wall['local'] / wall['ray:2']:.2f}x wall")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=500)
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--keep", type=Path, default=None, help="build in this directory and keep it")
    parser.add_argument("--parts", default="build,search,ray", help="which parts: build (1), search (2), ray (4)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per model process (default 1)")
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "attnscope-bench-index",
                        help="where the search part's corpus and index are built once and kept")
    parser.add_argument("--ef", default=f"64,{ann_lib.EF_SEARCH},256", help="efSearch values the search part tries")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    torch.set_num_threads(args.threads)
    model = attnscope.load_model()
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench_index_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        if "build" in parts:
            build_speed(model, args.documents, args.repeats, work)
        if "ray" in parts:
            ray_speed(model, args.documents, args.repeats, args.threads)
        if "search" in parts:
            search_at_scale(model, args.tokens, args.cache_dir, [int(e) for e in args.ef.split(",")])
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
