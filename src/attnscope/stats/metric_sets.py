"""What a corpus run computes: the built-in metrics plus the metric sets its settings name.

Nothing here changes at run time. A run's `Settings.metric_sets` lists sets by name ("norms")
or as `MetricSet` objects of one's own; `resolve` turns that list into the metrics and the
per-layer input maps of that run alone. A Ray worker resolves the same list from the settings
it is sent, so it computes what the driver asked for without any set-up of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

import torch

from attnscope.errors import AttnscopeError
from attnscope.stats import norm_metrics
from attnscope.stats.metrics import BUILTIN_METRICS, Metric

if TYPE_CHECKING:
    from attnscope.capture import AttentionCall
    from attnscope.models import Model
    from attnscope.stats.batching import Batch


@dataclass(frozen=True)
class LayerView:
    """What an input function sees for one layer of one batch."""

    call: AttentionCall
    layer: int
    batch: Batch
    model: Model


# Maps a metric can read, by name ("source"): each returns token-level [batch, head, query, key].
InputFn = Callable[[LayerView], torch.Tensor]


def attention_weights(view: LayerView) -> torch.Tensor:
    """The input "weights": the layer's attention weights [batch, head, query, key]."""
    return view.call.weights


@dataclass(frozen=True)
class MetricSet:
    """Metrics a run can add to the built-in ones, with the input maps they read besides "weights"."""

    name: str
    metrics: tuple[Metric, ...]
    inputs: tuple[tuple[str, InputFn], ...] = ()  # (source name, function) pairs


NORMS = MetricSet("norms", (*norm_metrics.NORM_METRICS, norm_metrics.OTHER_METRIC),
                  ((norm_metrics.NORM_SOURCE, norm_metrics.norm_input),))

# The sets a run can name (`attnscope stats --norms` names "norms"): read-only.
METRIC_SETS: Mapping[str, MetricSet] = MappingProxyType({NORMS.name: NORMS})
BUILTIN_INPUTS: Mapping[str, InputFn] = MappingProxyType({"weights": attention_weights})


@dataclass(frozen=True)
class Computation:
    """The metrics one run computes (those that apply to the model, in column order) and the maps they read."""

    metrics: tuple[Metric, ...]
    inputs: Mapping[str, InputFn]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.metrics)


def resolve(metric_sets: Sequence[str | MetricSet], causal: bool) -> Computation:
    """The built-in metrics plus those of each set (a name in METRIC_SETS or a MetricSet), for a causal
    model or not. Unknown names, a metric name used twice and a map no input provides are errors."""
    names = [set_name(s) for s in metric_sets]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise AttnscopeError(f"metric_sets lists {', '.join(map(repr, twice))} more than once: list each set once",
                             parameter="metric_sets")
    metrics, inputs = dict(BUILTIN_METRICS), dict(BUILTIN_INPUTS)
    for one in (named(s) for s in metric_sets):
        for metric in one.metrics:
            if metric.name in metrics:
                raise AttnscopeError(f"metric_sets: {one.name!r} has a metric named {metric.name!r}, which another "
                                     "set already has: rename it", parameter="metric_sets")
            metrics[metric.name] = metric
        for source, fn in one.inputs:
            if inputs.setdefault(source, fn) is not fn:
                raise AttnscopeError(f"metric_sets: {one.name!r} provides the input {source!r}, which another set "
                                     "provides too: rename it", parameter="metric_sets")
    chosen = tuple(m for m in metrics.values() if m.applies(causal))
    for metric in chosen:
        if metric.source not in inputs:
            raise AttnscopeError(f"metric {metric.name!r} reads the map {metric.source!r}, which no input provides: "
                                 "add it to its MetricSet's inputs")
    return Computation(chosen, MappingProxyType(inputs))


def named(metric_set: str | MetricSet) -> MetricSet:
    """A set given by name or as itself."""
    if isinstance(metric_set, MetricSet):
        return metric_set
    if metric_set not in METRIC_SETS:
        raise AttnscopeError(f"metric_sets: {metric_set!r} is not a metric set: use one of "
                             f"{', '.join(METRIC_SETS)}, or pass a MetricSet", parameter="metric_sets")
    return METRIC_SETS[metric_set]


def set_name(metric_set: str | MetricSet) -> str:
    """How a set is recorded in a checkpoint and in summary.json: its name."""
    return metric_set.name if isinstance(metric_set, MetricSet) else metric_set


def descriptions(metric_sets: Sequence[str | MetricSet] = ()) -> dict[str, str]:
    """{metric name: description} of the built-in metrics, the named sets and these sets."""
    out = {name: m.description for name, m in BUILTIN_METRICS.items()}
    for one in (*METRIC_SETS.values(), *(named(s) for s in metric_sets)):
        out.update({m.name: m.description for m in one.metrics})
    return out
