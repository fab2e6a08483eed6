"""faithfulness(): every attribution method's faithfulness over a corpus, streaming, checkpointed, resumable.

For each document of the source (attnscope.stats.sources.Source: the same formats as `attnscope stats`, its
malformed rows counted and reported): the attribution objective (attribution.objective), every method's
scores (attribution.api.attribute_objective) plus leave-one-out under the run's removal (the reference of the
rank agreement), the controls (random orderings, one per seed; the position baseline), then the metrics
(faithfulness.metrics) on the real model's measure of the modified inputs (faithfulness.perturb). A document
with fewer than 2 removable tokens (1 when nothing has to stay) is skipped and counted.
Outputs in OUTDIR: rows.jsonl (the per-example rows, written as the run goes), checkpoint.json, and at the end
examples.parquet, examples.json and summary.json (aggregates with 95% bootstrap intervals).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.attribution.api import attribute_objective, make_settings
from attnscope.attribution.methods import method_names
from attnscope.attribution.objective import build_objective
from attnscope.errors import AttnscopeError
from attnscope.faithfulness import aggregate, checkpoint
from attnscope.faithfulness import metrics as fm
from attnscope.faithfulness.perturb import DELETE, Perturber, check_removal, verified
from attnscope.faithfulness.report_page import write_report
from attnscope.models import DeviceLike, DtypeLike, Model, ModelLike, load_model
from attnscope.numbers import finite_or_null
from attnscope.stats.distributed import Engine
from attnscope.stats.sources import Document, Source

log = logging.getLogger(__name__)
LOO = {"delete": "leave_one_out", "replace": "leave_one_out_replaced"}
ALL, AGREEMENT = "all", "agreement"  # what a run measures: every metric, or only the rank agreement with LOO


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What a run computes (all of it guarded on resume); limit and checkpoint_every are not guarded."""

    methods: tuple[str, ...] | None = None  # None: attribution's defaults that apply to the model
    removal: str = DELETE
    seeds: int = 3  # random orderings per example
    max_length: int = 64  # tokens per example (longer texts are truncated)
    exact_tokens: int = fm.EXACT_TOKENS
    beam: int = fm.BEAM
    metrics: str = ALL  # AGREEMENT: Spearman and Kendall with leave-one-out only (no curves, no AOPC)

    def guarded(self) -> dict[str, Any]:
        out = {**asdict(self), "methods": list(self.methods) if self.methods is not None else None}
        if self.metrics == ALL:  # a run of every metric keeps the identity it had before the choice existed
            del out["metrics"]
        return out


@dataclass(frozen=True)
class Progress:
    documents: int
    examples: int
    seconds: float


@dataclass
class FaithfulnessResult:
    """A finished run: its per-example rows, the aggregates, and where they were written."""

    outdir: Path
    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    seconds: float
    resumed_from: int
    files: list[Path] = field(default_factory=list)


def faithfulness(source: str | Source, outdir: str | os.PathLike[str], model: ModelLike = None,
                 methods: str | Sequence[str] | None = None, *, removal: str = DELETE, limit: int | None = None,
                 resume: bool = False, seeds: int = 3, max_length: int = 64, exact_tokens: int = fm.EXACT_TOKENS,
                 beam: int = fm.BEAM, metrics: str = ALL, checkpoint_every: int = 1, device: DeviceLike = None,
                 dtype: DtypeLike = None, progress: Callable[[Progress], None] | None = None,
                 engine: str | Engine = "local", workers: int | None = None, address: str | None = None,
                 threads: int | None = None, png: bool = True) -> FaithfulnessResult:
    """Measure every method's faithfulness over the first `limit` documents of source, into outdir.

    removal: "delete" or "replace" (the baseline token), the same for every method. methods: as
    attnscope.attribute takes them (None: its defaults). Returns the rows (one per example and method,
    controls included: random_<seed>, position) and the summary (also written to outdir). metrics: "all", or
    "agreement" for only Spearman and Kendall with leave-one-out (about m + 2 forwards per example of m
    removable tokens instead of thousands: no curves, ERASER or AOPC). png: the curves also as PNG (headless
    Chromium; skipped with a warning when Playwright or Chromium is missing).
    engine="ray": the documents on Ray workers (pip install 'attnscope[ray]'), `workers` of them (default one
    per node) with `threads` torch threads each, on the cluster at `address` (default a local runtime); the
    rows, in the same order, and the summary equal the local run's bit for bit when each process runs as many
    torch threads as this one. An Engine (attnscope.stats.distributed.Engine) says all of that, and what the
    workers load, at once."""
    check_removal(removal)
    if metrics not in (ALL, AGREEMENT):
        raise AttnscopeError(f"unknown metrics {metrics!r}: use all (every metric) or agreement (Spearman and "
                             "Kendall with leave-one-out only)", parameter="metrics")
    placed = device is not None or dtype is not None
    where = engine if isinstance(engine, Engine) else Engine.of(engine, workers, address, threads, model, placed)
    names = tuple(method_names(methods)) if methods is not None else None
    for name, value in (("seeds", seeds), ("max_length", max_length), ("beam", beam),
                        ("checkpoint_every", checkpoint_every), ("limit", limit if limit is not None else 1)):
        if not isinstance(value, int) or value < 1:
            raise AttnscopeError(f"{name}={value!r} must be a positive integer", parameter=name)
    src = source if isinstance(source, Source) else Source(str(source))
    m = load_model(model, device=device, dtype=dtype)
    settings = Settings(methods=names, removal=removal, seeds=seeds, max_length=max_length,
                        exact_tokens=exact_tokens, beam=beam, metrics=metrics)
    return run(src, m, settings, Path(outdir), limit=limit, resume=resume, checkpoint_every=checkpoint_every,
               progress=progress, engine=where, png=png)


def identity(m: Model, source: Source, settings: Settings) -> dict[str, Any]:
    return {"model": m.name, "dtype": str(m.dtype).removeprefix("torch."), "source": source.describe(),
            "settings": settings.guarded()}


def run(source: Source, m: Model, settings: Settings, outdir: Path, limit: int | None = None,
        resume: bool = False, checkpoint_every: int = 1,
        progress: Callable[[Progress], None] | None = None, engine: Engine | None = None,
        png: bool = True) -> FaithfulnessResult:
    """The run over source (see faithfulness()); a checkpoint every checkpoint_every documents."""
    ident = identity(m, source, settings)
    pos = checkpoint.start(outdir, ident, resume)
    done_before, started = pos.documents, time.perf_counter()
    docs = itertools.islice(enumerate(source), pos.documents, limit)
    items = ((index, (index, doc)) for index, doc in docs)  # keyed by the document's index
    results = (engine or Engine()).run(indexed_rows, items, m, settings, name="attnscope-faithfulness")
    pending: list[dict[str, Any]] = []
    try:
        for index, rows in results:
            pending.extend(rows)
            pos = checkpoint.Position(documents=index + 1, examples=pos.examples + (1 if rows else 0),
                                      skipped=pos.skipped + (0 if rows else 1), bytes=pos.bytes)
            if (index + 1 - done_before) % checkpoint_every == 0:
                pos, pending = _save(outdir, ident, pos, pending), []
            if progress is not None:
                progress(Progress(pos.documents, pos.examples, time.perf_counter() - started))
    except KeyboardInterrupt:
        _save(outdir, ident, pos, pending)
        raise
    except AttnscopeError as exc:  # keep the documents before it
        _save(outdir, ident, pos, pending)
        raise AttnscopeError(f"{exc} ({pos.documents} documents before it are checkpointed in {outdir}: fix the "
                             "cause and run again with resume=True to continue)", parameter=exc.parameter) from exc
    finally:
        results.close()  # a Ray pass stops its workers (and the runtime it started) here
    pos = _save(outdir, ident, pos, pending)
    if pos.examples == 0:
        raise AttnscopeError(f"{source.spec} has no documents with removable tokens to measure")
    return finish(source, m, settings, outdir, ident, pos, time.perf_counter() - started, done_before, png)


def _save(outdir: Path, ident: dict[str, Any], pos: checkpoint.Position,
          rows: list[dict[str, Any]]) -> checkpoint.Position:
    size = checkpoint.append(outdir, rows)
    pos = checkpoint.Position(documents=pos.documents, examples=pos.examples, skipped=pos.skipped, bytes=size)
    checkpoint.save(outdir, ident, pos)
    return pos


def indexed_rows(m: Model, item: tuple[int, Document], settings: Settings) -> list[dict[str, Any]]:
    """The run's task, here or on a Ray worker: one (index, document)'s rows (example_rows)."""
    return example_rows(m, item[1], item[0], settings)


def example_rows(m: Model, doc: Document, index: int, settings: Settings) -> list[dict[str, Any]]:
    """One document's rows, one per method and control ([] when too short to measure)."""
    obj = build_objective(m, doc.text, max_length=settings.max_length)
    p = Perturber(obj, settings.removal)
    ex = p.example()
    if ex.steps < 1:
        return []
    loo_name = LOO[settings.removal]
    names = list(settings.methods) if settings.methods is not None else method_names(None)
    attribution = attribute_objective(obj, [*names, *([] if loo_name in names else [loo_name])], make_settings(),
                                      explicit=settings.methods is not None)
    scores = {name: ms.scores.sum(axis=0) for name, ms in attribution.methods.items()}  # [token]: over targets
    loo = scores[loo_name]
    checks = {name: ms.check.status for name, ms in attribution.methods.items()}
    scores.update({f"random_{s}": fm.random_scores(ex.n_tokens, s, index) for s in range(settings.seeds)})
    scores["position"] = fm.position_scores(ex.n_tokens, p.anchor)
    error = p.unperturbed_error()
    if settings.metrics == AGREEMENT:
        results = {name: _agreement(s, loo, ex.removable) for name, s in scores.items()}
    else:
        results = {name: r.to_row() for name, r in fm.evaluate(scores, ex, p.measure, loo, settings.exact_tokens,
                                                                 settings.beam).items()}
    common = {"example": index, "where": doc.where, "tokens": ex.n_tokens, "removable": ex.m,
              "min_kept": ex.min_kept, "full": ex.full, "unperturbed_error": error,
              "unperturbed_verified": verified(error), "forwards": p.forwards}
    return [{**common, "method": name, "check": checks.get(name, "control"), **r,
             "scores": scores[name][ex.removable].tolist()} for name, r in results.items()]


def _agreement(scores: np.ndarray, loo: np.ndarray, removable: np.ndarray) -> dict[str, float]:
    """Spearman and Kendall of scores [token] with leave-one-out's [token], on the removable tokens."""
    a, b = scores[removable], loo[removable]
    return {"spearman_loo": fm.spearman(a, b), "kendall_loo": fm.kendall(a, b)}


def finish(source: Source, m: Model, settings: Settings, outdir: Path, ident: dict[str, Any],
           pos: checkpoint.Position, seconds: float, done_before: int, png: bool = True) -> FaithfulnessResult:
    """Write examples.parquet, examples.json and summary.json; mark the checkpoint complete."""
    rows = checkpoint.read_rows(outdir)
    summary = {"model": m.name, "source": {**source.describe(), "malformed": source.malformed},
               "removal": settings.removal, "special_tokens_removed": False, "settings": settings.guarded(),
               "documents": pos.documents, "examples": pos.examples, "skipped": pos.skipped,
               "unperturbed_error_max": max(r["unperturbed_error"] for r in rows),
               "metrics": settings.metrics,
               "naopc_bounds": sorted({r["naopc_bound"] for r in rows if "naopc_bound" in r}),
               "methods": aggregate.summarise(rows), "agreement": aggregate.agreement(rows)}
    files = [_write_parquet(rows, outdir / "examples.parquet"), outdir / "examples.json", outdir / "summary.json"]
    (outdir / "examples.json").write_text(json.dumps(finite_or_null(rows), allow_nan=False), encoding="utf-8")
    strict = finite_or_null(summary)  # NaN as null, as JSON holds it
    (outdir / "summary.json").write_text(json.dumps(strict, allow_nan=False, indent=1), encoding="utf-8")
    files += write_report(strict, outdir, png=png)
    checkpoint.save(outdir, ident, checkpoint.Position(documents=pos.documents, examples=pos.examples,
                                                       skipped=pos.skipped, bytes=pos.bytes, complete=True))
    return FaithfulnessResult(outdir, rows, summary, seconds, done_before, files)


def _write_parquet(rows: list[dict[str, Any]], path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path

