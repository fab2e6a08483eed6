"""The corpus run: batches through the model, statistics folded in during the forward pass.

Each layer's attention call (attnscope.capture.recording) is turned into per-document
metric values at once; the maps are dropped before the next layer runs, so memory is flat
in the corpus size. The batches come from attnscope.stats.batching.numbered_batches (documents
in chunks, each chunk in length buckets); a checkpoint (attnscope.stats.checkpoint) records
(chunk, batch) with the exact state, so a resumed run does the remaining batches exactly as an
uninterrupted run would. What a run computes comes from its settings alone
(attnscope.stats.metric_sets.resolve).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from attnscope.capture import AttentionCall, recording
from attnscope.errors import AttnscopeError
from attnscope.families import is_causal
from attnscope.models import Model
from attnscope.stats import checkpoint
from attnscope.stats import syntax as syn
from attnscope.stats.batching import Batch, batches, numbered_batches
from attnscope.stats.metric_sets import Computation, LayerView, resolve
from attnscope.stats.metrics import Metric, RowFn, clean, row_mean
from attnscope.stats.settings import Settings, validate_settings
from attnscope.stats.sources import Document, Source
from attnscope.stats.state import StatsState

log = logging.getLogger(__name__)

__all__ = ["Progress", "RunResult", "Settings", "computation", "new_state", "process_documents", "run",
           "run_batch", "validate_settings", "values_of"]


@dataclass(frozen=True)
class Progress:
    documents: int
    tokens: int
    seconds: float
    total_documents: int | None


class _BatchRecorder:
    """Receives each layer's attention call and keeps only per-document values."""

    def __init__(self, model: Model, batch: Batch, computation: Computation, counts: syn.SyntaxCounts | None):
        self.model, self.batch, self.metrics, self.inputs = model, batch, computation.metrics, computation.inputs
        self.values: dict[str, list[torch.Tensor]] = {m.name: [] for m in self.metrics}  # per layer [batch, head]
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
                maps[metric.source] = self._units(self.inputs[metric.source](view))
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
                word = self.batch.word_maps.apply(on_cpu(call.weights))
            self.syntax_hits.append(syn.layer_hits(word, self.syntax))
        self.layer += 1

    def _keep(self, metric: Metric, values: torch.Tensor, ok: torch.Tensor) -> None:
        self.values[metric.name].append(values)
        self.ok[metric.name] = ok

    def _units(self, token_maps: torch.Tensor) -> torch.Tensor:
        maps = on_cpu(token_maps)
        if self.batch.unit_maps is not None:
            maps = self.batch.unit_maps.apply(maps)
        return clean(maps, self.batch.units)


def on_cpu(maps: torch.Tensor) -> torch.Tensor:
    """Maps as the statistics read them: float32 on the CPU (the tensor itself on a CPU float32 model;
    a model on another --device or --dtype has its maps widened there, never renormalised)."""
    return maps.detach().to("cpu", torch.float32)


def computation(model: Model, settings: Settings) -> Computation:
    """The metrics and input maps a run with these settings computes on this model."""
    return resolve(settings.metric_sets, is_causal(model.model))


def new_state(model: Model, settings: Settings, with_syntax: bool) -> StatsState:
    """An empty state for a run with these settings on this model (the syntax counts for CoNLL-U)."""
    causal = is_causal(model.model)
    names = computation(model, settings).names
    identity = {"model": model.name, "max_length": settings.max_length, "word_level": settings.word_level,
                "causal": causal}
    state = StatsState(model.n_layers, model.n_heads, names, identity)
    if with_syntax:
        state.syntax = syn.SyntaxCounts(model.n_layers, model.n_heads)
    return state


def run_batch(model: Model, batch: Batch, state: StatsState, settings: Settings) -> StatsState:
    """Run one batch through the model and return the state with it folded in (a new object).
    What is computed comes from the settings (a Ray worker gets them with each batch)."""
    comp = computation(model, settings)
    if comp.names != state.metrics:
        raise AttnscopeError(f"the state holds the metrics {', '.join(state.metrics)} but the settings compute "
                             f"{', '.join(comp.names)}: make the state with new_state(model, settings)")
    part = StatsState(state.layers, state.heads, state.metrics, dict(state.settings))
    if state.syntax is not None:
        part.syntax = syn.SyntaxCounts(state.layers, state.heads)
    rec = _BatchRecorder(model, batch, comp, part.syntax)
    with torch.inference_mode(), recording(model.model, rec):
        model.model(**{k: v.to(model.device) for k, v in batch.inputs.items()})
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


def process_documents(model: Model, docs: Sequence[Document], settings: Settings,
                      state: StatsState | None = None) -> StatsState:
    """Statistics of a list of documents (e.g. one block of a distributed run), as a mergeable state."""
    validate_settings(model, settings)
    if state is None:
        state = new_state(model, settings, with_syntax=any(d.heads is not None for d in docs))
    for batch in batches(model, list(docs), settings):
        state = run_batch(model, batch, state, settings)
    return state


@dataclass
class RunResult:
    state: StatsState
    seconds: float  # time spent in this process
    resumed_from: int  # documents already done by an earlier run
    resumed_tokens: int
    malformed: int


@dataclass
class Started:
    """A run about to do its batches: its checkpoint identity, state and position (fresh or resumed)."""

    identity: dict[str, object]
    state: StatsState
    position: checkpoint.Position


def start(source: Source, model: Model, settings: Settings, outdir: str | os.PathLike[str],
          resume: bool) -> Started:
    """Validate the settings and prepare outdir: a new state, or the checkpoint's with resume (either engine)."""
    validate_settings(model, settings)
    identity = checkpoint.identity(model, source, settings, computation(model, settings).names)
    found = checkpoint.start(outdir, identity, resume)
    if found is not None:
        return Started(identity, found.state, found.position)
    return Started(identity, new_state(model, settings, with_syntax=source.has_trees), (0, 0))


def run(source: Source, model: Model, settings: Settings, outdir: str | os.PathLike[str], resume: bool = False,
        progress: Callable[[Progress], None] | None = None, total: int | None = None) -> RunResult:
    """Run the statistics over a corpus, checkpointing into outdir; resume continues a stopped run."""
    begun = start(source, model, settings, outdir, resume)
    state, position, identity = begun.state, begun.position, begun.identity
    done_before, tokens_before, started = state.documents, state.tokens, time.perf_counter()
    n_batches = 0
    try:
        for key, batch in numbered_batches(model, source, settings, position):
            state = run_batch(model, batch, state, settings)
            n_batches += 1
            position = (key[0], key[1] + 1)
            if n_batches % settings.checkpoint_every == 0:
                checkpoint.save(outdir, identity, state, position, complete=False)
            if progress is not None:
                progress(Progress(state.documents, state.tokens, time.perf_counter() - started, total))
    except KeyboardInterrupt:
        checkpoint.save(outdir, identity, state, position, complete=False)
        raise
    except AttnscopeError as exc:  # e.g. a non-UTF-8 line far into the corpus: keep what was done before it
        raise checkpoint.kept(exc, outdir, identity, state, position, done_before) from exc
    finish(source, outdir, identity, state, position)
    return RunResult(state, time.perf_counter() - started, done_before, tokens_before, source.malformed)


def finish(source: Source, outdir: str | os.PathLike[str], identity: dict[str, object], state: StatsState,
           position: checkpoint.Position) -> None:
    """Save the complete checkpoint; a run with no documents saves nothing (the same command works once
    the source has documents)."""
    if state.documents == 0:
        raise AttnscopeError(f"{source.spec} has no documents to read")
    checkpoint.save(outdir, identity, state, position, complete=True)


def values_of(state: StatsState) -> dict[str, dict[str, np.ndarray]]:
    """{metric: {"mean", "std", "count"}} arrays [layer, head]."""
    return {name: {"mean": state.mean(name), "std": state.std(name), "count": state.count[name]}
            for name in state.metrics}
