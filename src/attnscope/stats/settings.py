"""A corpus run's settings: how it reads and batches its corpus, and what it computes.

Every field changes the numbers or which batch comes where (so a resume must keep it), unless
its metadata says `RESUME_MAY_CHANGE`: the checkpoint guard reads this list from the dataclass
itself, so a new field is guarded unless it is marked.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from attnscope.errors import AttnscopeError
from attnscope.stats.metric_sets import MetricSet, set_name
from attnscope.tokens import validate_max_length

if TYPE_CHECKING:
    from attnscope.models import Model

RESUME_MAY_CHANGE = {"resume": "may change"}  # field metadata: changing it on resume changes no number


@dataclass(frozen=True)
class Settings:
    """How a run reads and batches its corpus, and which metric sets it adds to the built-in metrics."""

    max_length: int = 256
    batch_size: int = 32
    word_level: bool = False
    truncate: bool = True  # False: an over-long document is an error
    limit: int | None = None
    checkpoint_every: int = field(default=20, metadata=RESUME_MAY_CHANGE)  # batches
    chunk_batches: int = 8  # documents are bucketed by length within chunks of chunk_batches * batch_size
    cell_budget: int = 0  # max documents x longest^2 per batch; 0 = batch_size * 24^2
    metric_sets: tuple[str | MetricSet, ...] = ()  # e.g. ("norms",): see attnscope.stats.metric_sets

    @property
    def budget(self) -> int:
        # Small enough that ordinary sentences already reach it: the memory peak is then the same
        # for a small corpus and a large one; long documents simply come in smaller batches.
        return self.cell_budget or self.batch_size * 24 * 24

    @property
    def chunk_documents(self) -> int:
        return self.chunk_batches * self.batch_size

    def to_json(self) -> dict[str, Any]:
        """Every field, JSON-able (a metric set by its name)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["metric_sets"] = [set_name(s) for s in self.metric_sets]
        return out


def guarded() -> tuple[str, ...]:
    """The fields a resume must keep: all but those marked RESUME_MAY_CHANGE."""
    return tuple(f.name for f in fields(Settings) if f.metadata != RESUME_MAY_CHANGE)


def validate_settings(model: Model, settings: Settings) -> None:
    """One-line errors naming the parameter for values no run can use."""
    validate_max_length(model.tokenizer, settings.max_length, positions=model.max_positions, model=model.name)
    for name in ("batch_size", "checkpoint_every", "chunk_batches"):
        if getattr(settings, name) < 1:
            raise AttnscopeError(f"{name}={getattr(settings, name)} must be at least 1", parameter=name)
    if settings.limit is not None and settings.limit < 1:
        raise AttnscopeError(f"limit={settings.limit} must be at least 1", parameter="limit")
    if settings.cell_budget < 0:
        raise AttnscopeError(f"cell_budget={settings.cell_budget} must be at least 0 (0: 24^2 cells per document)",
                             parameter="cell_budget")
    if isinstance(settings.metric_sets, str):
        raise AttnscopeError(f"metric_sets={settings.metric_sets!r} must be a tuple of sets, "
                             f"e.g. ({settings.metric_sets!r},)", parameter="metric_sets")
