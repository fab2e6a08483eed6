"""Corpus statistics: per-head attention analysis (Clark et al. 2019) over a whole corpus.

`run` streams a Source through a model with statistics computed inside the forward pass;
`process_documents` turns one list of documents into a mergeable `StatsState` (for
distributed runs); `write_outputs` writes the tables, plots and report.
"""

from attnscope.stats.engine import (
    INPUTS,
    LayerView,
    Progress,
    RunResult,
    Settings,
    new_state,
    process_documents,
    register_input,
    run,
)
from attnscope.stats.metrics import METRICS, Metric, Units, register_metric
from attnscope.stats.sources import Document, Source
from attnscope.stats.state import StatsState, merge_all

__all__ = [
    "INPUTS",
    "METRICS",
    "Document",
    "LayerView",
    "Metric",
    "Progress",
    "RunResult",
    "Settings",
    "Source",
    "StatsState",
    "Units",
    "merge_all",
    "new_state",
    "process_documents",
    "register_input",
    "register_metric",
    "run",
]
