"""The heads pass: one streaming, checkpointed, resumable pass over a corpus that accumulates, sentence by sentence,
the Jensen-Shannon distance between every two heads of the model and each head's behaviour (corpus/head_sums.py),
and on CoNLL-U the heads' dependency accuracy (stats/syntax.py, Clark et al. 2019's).

A corpus index (corpus/index.py) keeps a summary of each chosen head's attention, not its rows, so the distances need
the rows again: this pass runs the model over the corpus itself, with the corpus statistics' documents and batches
(stats.batching.numbered_batches: the same chunks, buckets and (chunk, batch) numbering). Every `checkpoint_every`
batches OUTDIR/heads.npz is replaced atomically with the exact float64 sums and the position after the batch; a pass
killed at any moment resumes from it and ends with the same bits as an uninterrupted one.

Each batch is one task (`batch_part`), here or with engine="ray" on Ray workers (attnscope.stats.distributed.Engine,
as for an index build): it returns each sentence's own sums and the batch's dependency counts, and the driver adds
them in the batches' order, sentence by sentence, as the local loop does (0 + x is x exactly), so heads.npz is the
local engine's byte for byte when every model process runs as many torch threads.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnscope.capture import AttentionCall, recording
from attnscope.corpus.head_sums import FILE, HeadSums, add_sentence, load, save
from attnscope.errors import AttnscopeError
from attnscope.families import is_causal
from attnscope.models import Model, ModelLike, load_model
from attnscope.stats import syntax as syn
from attnscope.stats.batching import Batch, numbered_batches
from attnscope.stats.checkpoint import differences, identity
from attnscope.stats.distributed import Engine
from attnscope.stats.engine import Progress
from attnscope.stats.settings import Settings, validate_settings
from attnscope.stats.sources import Source

METRICS = ("heads-js",)  # the identity's "metrics": what this pass computes


@dataclass(frozen=True, kw_only=True)
class HeadsRun:
    """What a heads pass did: its file, the sums, the syntax counts (CoNLL-U; else None), its time in this process."""

    path: Path
    sums: HeadSums
    syntax: syn.SyntaxCounts | None
    model: str
    causal: bool
    seconds: float
    resumed_from: int
    malformed: int


class _Rows:
    """Keeps every layer's attention weights of a batch: [batch, head, query, key] each, on the CPU in float64."""

    def __init__(self) -> None:
        self.layers: list[torch.Tensor] = []

    def on_attention(self, call: AttentionCall) -> None:
        self.layers.append(call.weights.detach().to("cpu", torch.float64))


@dataclass(frozen=True, kw_only=True)
class BatchSums:
    """One batch's share of the pass, as its task computes it: each sentence's own sums in the batch's order (the
    driver adds them one at a time, so the float64 sums have the bits of adding the sentences directly) and the
    batch's dependency counts (exact integers; None without UD trees)."""

    sentences: list[HeadSums]
    syntax: syn.SyntaxCounts | None


def batch_part(model: Model, batch: Batch, work: tuple[bool, bool]) -> BatchSums:
    """The pass's task, here or on a Ray worker: run one batch; work = (causal, the corpus has UD trees)."""
    causal, trees = work
    rec = _Rows()
    with torch.inference_mode(), recording(model.model, rec):
        model.base(**{k: v.to(model.device) for k, v in batch.inputs.items()})
    if len(rec.layers) != model.n_layers:
        raise AttnscopeError(f"saw {len(rec.layers)} attention calls for a model of {model.n_layers} layers")
    weights = torch.stack(rec.layers, 1)  # [batch, layer, head, query, key]
    sentences = []
    for b, d in enumerate(batch.docs):
        n = d.n_tokens  # right-padded: the real tokens come first
        one = HeadSums(layers=model.n_layers, heads=model.n_heads)
        p = weights[b, :, :, :n, :n].reshape(one.units, n, n).numpy()  # [unit, query, key]
        add_sentence(one, p, np.asarray(d.special, dtype=bool), causal)
        sentences.append(one)
    counts = syn.SyntaxCounts(model.n_layers, model.n_heads) if trees else None
    if counts is not None and batch.word_maps is not None:
        sb = syn.syntax_batch(batch.docs, batch.word_maps, counts)
        hits = [syn.layer_hits(batch.word_maps.apply(w.to(torch.float32)), sb) for w in rec.layers]
        syn.fold_layers(counts, list(syn.count_hits(torch.stack(hits), sb)), sb)
    return BatchSums(sentences=sentences, syntax=counts)


def fold(sums: HeadSums, counts: syn.SyntaxCounts | None, part: BatchSums) -> syn.SyntaxCounts | None:
    """Add a batch's part into the pass's sums (in place, sentence by sentence); returns the merged counts."""
    for one in part.sentences:
        sums.merge(one)
    return counts if counts is None or part.syntax is None else counts.merge(part.syntax)


def head_pass(source: Source, out: str | Path, model: ModelLike = None, *, settings: Settings | None = None,
              resume: bool = False, progress: Callable[[Progress], None] | None = None,
              engine: str | Engine = "local", workers: int | None = None, address: str | None = None,
              threads: int | None = None) -> HeadsRun:
    """Run the heads pass over a corpus into the directory `out` (OUT/heads.npz); resume=True continues an
    interrupted pass there (the same model, source and settings, else a one-line refusal naming what differs).

    engine="ray": the batches on Ray workers (pip install 'attnscope[ray]'), `workers` of them (default one per
    node) with `threads` torch threads each, on the cluster at `address` (default a local runtime); heads.npz is the
    local pass's byte for byte when each process runs as many torch threads as this one, and a pass begun on one
    engine resumes on the other. An Engine (attnscope.stats.distributed.Engine) says all of that at once."""
    where = engine if isinstance(engine, Engine) else Engine.of(engine, workers, address, threads, model)
    m = model if isinstance(model, Model) else load_model(model)
    settings = settings or Settings(max_length=min(128, m.max_positions), batch_size=8)
    validate_settings(m, settings)
    root, causal = Path(out), is_causal(m.model)
    ident = identity(m, source, settings, METRICS)
    sums, counts, position, complete = _start(root, ident, m, source, resume)
    before, started = sums.documents, time.perf_counter()
    if complete:
        return HeadsRun(path=root / FILE, sums=sums, syntax=counts, model=m.name, causal=causal, seconds=0.0,
                        resumed_from=before, malformed=0)
    n_batches = 0
    parts = where.run(batch_part, numbered_batches(m, source, settings, position), m, (causal, counts is not None),
                      name="attnscope-heads")
    try:
        for key, part in parts:
            counts = fold(sums, counts, part)
            position, n_batches = (key[0], key[1] + 1), n_batches + 1
            if n_batches % settings.checkpoint_every == 0:
                _save(root, sums, counts, ident, position, m.name, causal, complete=False)
            if progress is not None:
                progress(Progress(sums.documents, sums.tokens, time.perf_counter() - started, None))
    except KeyboardInterrupt:
        _save(root, sums, counts, ident, position, m.name, causal, complete=False)
        raise
    finally:
        parts.close()  # a Ray pass stops its workers (and the runtime it started) here
    if sums.documents == 0:
        raise AttnscopeError(f"{source.spec} has no documents to read")
    _save(root, sums, counts, ident, position, m.name, causal, complete=True)
    return HeadsRun(path=root / FILE, sums=sums, syntax=counts, model=m.name, causal=causal,
                    seconds=time.perf_counter() - started, resumed_from=before, malformed=source.malformed)


def _start(root: Path, ident: dict[str, Any], m: Model, source: Source,
           resume: bool) -> tuple[HeadSums, syn.SyntaxCounts | None, tuple[int, int], bool]:
    """A new pass (root created), or with resume the checkpointed sums, syntax counts and position."""
    path = root / FILE
    if path.exists() and not resume:
        raise AttnscopeError(f"{path} exists: continue that pass with resume=True, or write into another directory",
                             parameter="resume")
    if resume and path.exists():
        sums, meta = load(path)
        changed = differences(meta["identity"], json.loads(json.dumps(ident)))
        if changed:
            raise AttnscopeError(f"{path} is from a pass with other arguments ({changed}): resume with the same "
                                 "arguments, or write into another directory")
        counts = syn.SyntaxCounts.from_dict(meta["syntax"]) if meta.get("syntax") else None
        return sums, counts, (int(meta["chunk"]), int(meta["batch"])), bool(meta["complete"])
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AttnscopeError(f"cannot create {root}: {exc.strerror or exc}: choose another directory") from exc
    counts = syn.SyntaxCounts(m.n_layers, m.n_heads) if source.has_trees else None
    return HeadSums(layers=m.n_layers, heads=m.n_heads), counts, (0, 0), False


def _save(root: Path, sums: HeadSums, counts: syn.SyntaxCounts | None, ident: dict[str, Any],
          position: tuple[int, int], model: str, causal: bool, complete: bool) -> None:
    meta = {"identity": ident, "chunk": position[0], "batch": position[1], "complete": complete, "model": model,
            "causal": causal, "syntax": None if counts is None else counts.to_dict()}
    save(root / FILE, sums, meta)


__all__ = ["FILE", "BatchSums", "HeadsRun", "batch_part", "fold", "head_pass"]
