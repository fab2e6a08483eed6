"""Corpus statistics: per-head attention analysis (Clark et al. 2019) over a whole corpus.

`run` streams a Source through a model with statistics computed inside the forward pass;
`process_documents` turns one list of documents into a mergeable `StatsState` (for
distributed runs); `write_outputs` writes the tables, plots and report. What a run computes
is the built-in metrics plus the metric sets its `Settings.metric_sets` names ("norms", or a
`MetricSet` of one's own); checkpoints are `attnscope.stats.checkpoint`.
"""

from attnscope.stats.engine import Progress, RunResult, new_state, process_documents, run, run_batch
from attnscope.stats.metric_sets import METRIC_SETS, LayerView, MetricSet, resolve
from attnscope.stats.metrics import BUILTIN_METRICS, Metric, Units
from attnscope.stats.settings import Settings
from attnscope.stats.sources import Document, Source
from attnscope.stats.state import StatsState, merge_all

__all__ = [
    "BUILTIN_METRICS",
    "METRIC_SETS",
    "Document",
    "LayerView",
    "Metric",
    "MetricSet",
    "Progress",
    "RunResult",
    "Settings",
    "Source",
    "StatsState",
    "Units",
    "merge_all",
    "new_state",
    "process_documents",
    "resolve",
    "run",
    "run_batch",
]
