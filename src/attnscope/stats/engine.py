"""The corpus run: batches through the model, statistics folded in during the forward pass.

Each layer's attention call (attnscope.capture.recording) is turned into per-document
metric values at once; the maps are dropped before the next layer runs, so memory is flat
in the corpus size. Documents are read in chunks of a fixed number, each chunk sorted
into length buckets; a checkpoint records (chunk, batch) with the exact state, so a
resumed run does the remaining batches exactly as an uninterrupted run would.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnscope.capture import AttentionCall, recording
from attnscope.errors import AttnscopeError
from attnscope.families import is_causal
from attnscope.models import Model
from attnscope.stats import syntax as syn
from attnscope.stats.batching import Batch, make_batch, plan, tokenize
from attnscope.stats.metrics import Metric, RowFn, clean, metrics_for, row_mean
from attnscope.stats.sources import Document, Source
from attnscope.stats.state import StatsState

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.json"


@dataclass(frozen=True)
class Settings:
    """How a run reads and batches its corpus. Only max_length and word_level change the numbers;
    the rest must match too for a resume, so the remaining batches are the same."""

    max_length: int = 256
    batch_size: int = 32
    word_level: bool = False
    truncate: bool = True  # False: an over-long document is an error
    limit: int | None = None
    checkpoint_every: int = 20  # batches
    chunk_batches: int = 8  # documents are bucketed by length within chunks of chunk_batches * batch_size
    cell_budget: int = 0  # max documents x longest^2 per batch; 0 = batch_size * 24^2

    @property
    def budget(self) -> int:
        # Small enough that ordinary sentences already reach it: the memory peak is then the same
        # for a small corpus and a large one; long documents simply come in smaller batches.
        return self.cell_budget or self.batch_size * 24 * 24

    @property
    def chunk_documents(self) -> int:
        return self.chunk_batches * self.batch_size


@dataclass(frozen=True)
class LayerView:
    """What an input function sees for one layer of one batch."""

    call: AttentionCall
    layer: int
    batch: Batch
    model: Model


# Maps a metric can read, by name: each returns token-level [batch, head, query, key].
# A metric needing another per-batch input (e.g. norm-weighted attention) registers one here.
InputFn = Callable[[LayerView], torch.Tensor]
INPUTS: dict[str, InputFn] = {"weights": lambda view: view.call.weights}


def register_input(name: str, fn: InputFn) -> None:
    if name in INPUTS:
        raise AttnscopeError(f"an input named {name!r} is already registered")
    INPUTS[name] = fn


@dataclass(frozen=True)
class Progress:
    documents: int
    tokens: int
    seconds: float
    total_documents: int | None


class _BatchRecorder:
    """Receives each layer's attention call and keeps only per-document values."""

    def __init__(self, model: Model, batch: Batch, metrics: list[Metric], counts: syn.SyntaxCounts | None):
        self.model, self.batch, self.metrics = model, batch, metrics
        self.values: dict[str, list[torch.Tensor]] = {m.name: [] for m in metrics}  # per layer [batch, head]
        self.ok: dict[str, torch.Tensor] = {}
        self.syntax = syn.syntax_batch(batch.docs, batch.word_maps, counts) if (
            counts is not None and batch.word_maps is not None) else None
        self.syntax_hits: list[torch.Tensor] = []  # per layer [direction, head, batch * unit]
        self.layer = 0

    def on_attention(self, call: AttentionCall) -> None:
        view = LayerView(call, self.layer, self.batch, self.model)
        units = self.batch.units
        maps: dict[str, torch.Tensor] = {}
        per_row: dict[tuple[RowFn, str], torch.Tensor] = {}  # each per-row function once: [batch, head, query]
        means: list[tuple[Metric, torch.Tensor]] = []  # the means over rows, taken together below
        for metric in self.metrics:
            if metric.source not in maps:
                maps[metric.source] = self._units(INPUTS[metric.source](view))
            if metric.per_row is None or metric.reduce is None:
                self._keep(metric, *metric.fn(maps[metric.source], units))
                continue
            key = (metric.per_row, metric.source)
            if key not in per_row:
                per_row[key] = metric.per_row(maps[metric.source], units)
            if metric.reduce is row_mean:
                means.append((metric, per_row[key]))
            else:
                self._keep(metric, *metric.reduce(per_row[key], units))
        if means:
            values, ok = row_mean(torch.stack([rows for _, rows in means]), units)  # [metric, batch, head]
            for (metric, _), one in zip(means, values, strict=True):
                self._keep(metric, one, ok)
        if self.syntax is not None:
            word = maps["weights"] if self.batch.unit_maps is self.batch.word_maps and "weights" in maps else None
            if word is None:
                assert self.batch.word_maps is not None
                word = self.batch.word_maps.apply(call.weights.detach())
            self.syntax_hits.append(syn.layer_hits(word, self.syntax))
        self.layer += 1

    def _keep(self, metric: Metric, values: torch.Tensor, ok: torch.Tensor) -> None:
        self.values[metric.name].append(values)
        self.ok[metric.name] = ok

    def _units(self, token_maps: torch.Tensor) -> torch.Tensor:
        maps = token_maps.detach()
        if self.batch.unit_maps is not None:
            maps = self.batch.unit_maps.apply(maps)
        return clean(maps, self.batch.units)


def new_state(model: Model, settings: Settings, with_syntax: bool) -> StatsState:
    causal = is_causal(model.model)
    for metric in metrics_for(causal):
        if metric.source not in INPUTS:
            raise AttnscopeError(f"metric {metric.name!r} reads the map {metric.source!r}, which no input provides: "
                                 "register one with attnscope.stats.register_input")
    names = tuple(m.name for m in metrics_for(causal))
    identity = {"model": model.name, "max_length": settings.max_length, "word_level": settings.word_level,
                "causal": causal}
    state = StatsState(model.n_layers, model.n_heads, names, identity)
    if with_syntax:
        state.syntax = syn.SyntaxCounts(model.n_layers, model.n_heads)
    return state


def run_batch(model: Model, batch: Batch, state: StatsState) -> StatsState:
    """Run one batch through the model and return the state with it folded in (a new object)."""
    part = StatsState(state.layers, state.heads, state.metrics, dict(state.settings))
    if state.syntax is not None:
        part.syntax = syn.SyntaxCounts(state.layers, state.heads)
    metrics = metrics_named(state.metrics, bool(state.settings["causal"]))
    rec = _BatchRecorder(model, batch, metrics, part.syntax)
    with torch.inference_mode(), recording(model.model, rec):
        model.model(**batch.inputs)
    if rec.layer != state.layers:
        raise AttnscopeError(f"saw {rec.layer} attention calls for a model of {state.layers} layers")
    names = list(rec.values)
    values = torch.stack([torch.stack(rec.values[n], dim=1) for n in names], dim=1)  # [document, metric, layer, head]
    part.add_many(names, values.numpy(), torch.stack([rec.ok[n] for n in names], dim=1).numpy())
    if rec.syntax is not None and part.syntax is not None:
        syn.fold_layers(part.syntax, list(syn.count_hits(torch.stack(rec.syntax_hits), rec.syntax)), rec.syntax)
    part.documents, part.tokens = len(batch.docs), batch.tokens
    part.truncated = sum(d.truncated for d in batch.docs)
    return state.merge(part)


def metrics_named(names: Sequence[str], causal: bool) -> list[Metric]:
    """The registered metrics of these names, in this order. A Ray worker is a process of its own: the
    norm-weighted metrics that `--norms` registered in the driver are registered here when a state needs
    them; any other metric missing here is an error rather than a column of NaN."""
    known = {m.name: m for m in metrics_for(causal)}
    if any(n not in known for n in names):
        from attnscope.stats import norm_metrics

        if any(n in norm_metrics.NAMES for n in names if n not in known):
            norm_metrics.register()
            known = {m.name: m for m in metrics_for(causal)}
    missing = [n for n in names if n not in known]
    if missing:
        raise AttnscopeError(f"metric {', '.join(missing)} is not registered in process {os.getpid()}: register it "
                             "in every process that runs batches (e.g. when a module the workers import is imported)")
    return [known[n] for n in names]


def process_documents(model: Model, docs: Sequence[Document], settings: Settings,
                      state: StatsState | None = None) -> StatsState:
    """Statistics of a list of documents (e.g. one block of a distributed run), as a mergeable state."""
    validate_settings(model, settings)
    if state is None:
        state = new_state(model, settings, with_syntax=any(d.heads is not None for d in docs))
    for batch in _batches(model, list(docs), settings):
        state = run_batch(model, batch, state)
    return state


def validate_settings(model: Model, settings: Settings) -> None:
    if settings.max_length < 2:
        raise AttnscopeError(f"--max-length {settings.max_length} is too small: use at least 2 tokens")
    if settings.max_length > model.max_positions:
        raise AttnscopeError(f"--max-length {settings.max_length} exceeds what {model.name} can read "
                             f"({model.max_positions} positions): use at most {model.max_positions}")
    if settings.batch_size < 1:
        raise AttnscopeError(f"--batch-size {settings.batch_size} must be at least 1")
    if settings.limit is not None and settings.limit < 1:
        raise AttnscopeError(f"--limit {settings.limit} must be at least 1")


def _batches(model: Model, docs: list[Document], settings: Settings, skip: int = 0) -> Iterator[Batch]:
    if not docs:
        return
    tok = model.tokenizer
    prepared = tokenize(tok, docs, settings.max_length)
    if not settings.truncate:
        for p in prepared:
            if p.truncated:
                raise AttnscopeError(f"{p.doc.where}: the document is over {settings.max_length} tokens: "
                                     "raise --max-length or drop --no-truncate to truncate it")
    causal = is_causal(model.model)
    pad = int(tok.pad_token_id if tok.pad_token_id is not None else 0)
    for idx in plan(prepared, settings.batch_size, settings.budget)[skip:]:
        if len({prepared[i].doc.heads is None for i in idx}) > 1:
            raise AttnscopeError("a corpus mixes documents with and without dependency trees")
        yield make_batch([prepared[i] for i in idx], pad, settings.word_level, causal,
                         tok.cls_token_id, tok.sep_token_id, settings.max_length)


@dataclass
class RunResult:
    state: StatsState
    seconds: float  # time spent in this process
    resumed_from: int  # documents already done by an earlier run
    resumed_tokens: int
    malformed: int


def run(source: Source, model: Model, settings: Settings, outdir: str | os.PathLike[str], resume: bool = False,
        progress: Callable[[Progress], None] | None = None, total: int | None = None) -> RunResult:
    """Run the statistics over a corpus, checkpointing into outdir; resume continues a stopped run."""
    validate_settings(model, settings)
    out = Path(outdir)
    identity = run_identity(model, source, settings)
    state, chunk0, batch0 = _start(out, identity, resume)
    if state is None:
        state = new_state(model, settings, with_syntax=source.has_trees)
    done_before, tokens_before, started = state.documents, state.tokens, time.perf_counter()
    position = (chunk0, batch0)
    n_batches = 0
    try:
        for c, chunk in enumerate(_chunks(_limited(source, settings.limit), settings.chunk_documents)):
            if c < chunk0:
                continue
            for j, batch in enumerate(_batches(model, chunk, settings, skip=batch0 if c == chunk0 else 0)):
                state = run_batch(model, batch, state)
                n_batches += 1
                position = (c, (batch0 if c == chunk0 else 0) + j + 1)
                if n_batches % settings.checkpoint_every == 0:
                    _save(out, identity, state, position, complete=False)
                if progress is not None:
                    progress(Progress(state.documents, state.tokens, time.perf_counter() - started, total))
            position = (c + 1, 0)
    except KeyboardInterrupt:
        _save(out, identity, state, position, complete=False)
        raise
    except AttnscopeError as exc:  # e.g. a non-UTF-8 line far into the corpus: keep what was done before it
        raise kept(exc, out, identity, state, position, done_before) from exc
    if state.documents == 0:  # nothing saved: the same command works once the source has documents
        raise AttnscopeError(f"{source.spec} has no documents to read")
    _save(out, identity, state, position, complete=True)
    return RunResult(state, time.perf_counter() - started, done_before, tokens_before, source.malformed)


def _limited(docs: Iterable[Document], limit: int | None) -> Iterator[Document]:
    return iter(docs) if limit is None else itertools.islice(docs, limit)


def _chunks(docs: Iterator[Document], size: int) -> Iterator[list[Document]]:
    while chunk := list(itertools.islice(docs, size)):
        yield chunk


def run_identity(model: Model, source: Source, settings: Settings) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: the model, the source, the settings and the metrics
    (e.g. --norms adds some), so the remaining batches are the same and every metric counts every document."""
    metrics = [m.name for m in metrics_for(is_causal(model.model))]
    return {"model": model.name, "source": source.describe(), "settings": asdict(settings), "metrics": metrics}


def kept(exc: AttnscopeError, out: Path, identity: dict[str, Any], state: StatsState, position: tuple[int, int],
         done_before: int) -> AttnscopeError:
    """The error of a run stopped part-way, after checkpointing the documents done before it."""
    if state.documents == done_before:
        return exc
    _save(out, identity, state, position, complete=False)
    return AttnscopeError(f"{exc} ({state.documents} documents before it are checkpointed in {out}: "
                          "fix the cause and add --resume to continue)")


def _start(out: Path, identity: dict[str, Any], resume: bool) -> tuple[StatsState | None, int, int]:
    """(state, chunk, batch) to continue from; refuses to overwrite a directory without --resume."""
    ckpt = out / CHECKPOINT
    if not resume:
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise AttnscopeError(f"{out} already exists and is not empty: pass --resume to continue that run, "
                                 "or choose another output directory")
        _mkdir(out)
        return None, 0, 0
    if not ckpt.is_file():
        if out.exists() and any(out.iterdir()):
            raise AttnscopeError(f"{out} has no {CHECKPOINT} to resume from: choose another output directory")
        _mkdir(out)
        return None, 0, 0
    try:
        data = json.loads(ckpt.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AttnscopeError(f"cannot read {ckpt} ({exc}): choose another output directory") from exc
    changed = _differences(data.get("identity") if isinstance(data, dict) else None, json.loads(json.dumps(identity)))
    if changed:
        raise AttnscopeError(f"{ckpt} is from a run with other arguments ({changed}): resume with the same "
                             "arguments, or choose another output directory")
    log.info("resuming %s at chunk %d, batch %d", out, data["chunk"], data["batch"])
    return StatsState.from_dict(data["state"]), int(data["chunk"]), int(data["batch"])


def _mkdir(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AttnscopeError(f"cannot create the output directory {out}: {exc.strerror or exc}: "
                             "choose another with -o") from exc


def _differences(then: Any, now: dict[str, Any]) -> str:
    """What differs between a checkpoint's identity and this run's, e.g. "settings.max_length 256 -> 128"."""
    if not isinstance(then, dict):
        return "a checkpoint of another attnscope version"
    flat_then, flat_now = _flat(then), _flat(now)
    out = []
    for key in dict.fromkeys([*flat_then, *flat_now]):
        old, new = flat_then.get(key, "(none)"), flat_now.get(key, "(none)")
        if old == new:
            continue
        if isinstance(old, list) and isinstance(new, list):  # the metrics: name what was added or dropped
            out.append(f"{key} " + ", ".join([f"+{m}" for m in new if m not in old] +
                                             [f"-{m}" for m in old if m not in new]))
        else:
            out.append(f"{key} {old} -> {new}")
    return "; ".join(out)


def _flat(identity: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}"""
    out: dict[str, Any] = {}
    for key, value in identity.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _save(out: Path, identity: dict[str, Any], state: StatsState, position: tuple[int, int],
          complete: bool) -> None:
    """Write the checkpoint atomically (a kill mid-write leaves the previous one)."""
    data = {"identity": identity, "chunk": position[0], "batch": position[1], "complete": complete,
            "state": state.to_dict()}
    tmp = out / (CHECKPOINT + ".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, out / CHECKPOINT)


def values_of(state: StatsState) -> dict[str, dict[str, np.ndarray]]:
    """{metric: {"mean", "std", "count"}} arrays [layer, head]."""
    return {name: {"mean": state.mean(name), "std": state.std(name), "count": state.count[name]}
            for name in state.metrics}
