"""A mergeable aggregate of per-document statistics: counts, sums and sums of squares per layer x head.

Each per-document value v is fixed to the grid 2^-32 (|error| <= 1.2e-10) and summed as an
exact integer, so merging states is exact: associative and independent of order. That is
what lets a run resume from a checkpoint, or many workers (issue 7) combine partial states,
and still give bit-for-bit the same corpus figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnscope.errors import AttnscopeError
from attnscope.stats.syntax import SyntaxCounts

SCALE = 2**32  # per-document values are stored as round(v * SCALE)
_LIMIT = 2.0**30  # |v| must stay below this for the fixed point to be exact


@dataclass
class StatsState:
    """Running statistics of one corpus run (or part of one)."""

    layers: int
    heads: int
    metrics: tuple[str, ...]
    settings: dict[str, Any] = field(default_factory=dict)  # what must match to merge
    count: dict[str, np.ndarray] = field(default_factory=dict)  # int64 [layer, head]: documents
    total: dict[str, np.ndarray] = field(default_factory=dict)  # Python ints [layer, head]: sum of q
    squares: dict[str, np.ndarray] = field(default_factory=dict)  # Python ints [layer, head]: sum of q^2
    documents: int = 0
    tokens: int = 0  # tokens read by the model (after truncation, special tokens included)
    truncated: int = 0
    syntax: SyntaxCounts | None = None

    def __post_init__(self) -> None:
        for name in self.metrics:
            if name not in self.count:
                self.count[name] = np.zeros((self.layers, self.heads), dtype=np.int64)
                self.total[name] = _ints((self.layers, self.heads))
                self.squares[name] = _ints((self.layers, self.heads))

    def add(self, name: str, values: np.ndarray, ok: np.ndarray) -> None:
        """Fold per-document values [document, layer, head] (float64) where ok [document] holds."""
        self.add_many([name], values[:, None], ok[:, None])

    def add_many(self, names: list[str], values: np.ndarray, ok: np.ndarray) -> None:
        """Fold per-document values of several metrics [document, metric, layer, head] (float64) where
        ok [document, metric] holds: one batch's values, summed in one pass."""
        kept = np.where(ok[:, :, None, None], values, 0.0)  # a value that is not defined adds nothing
        for i, name in enumerate(names):
            if not np.isfinite(kept[:, i]).all():
                raise AttnscopeError(f"the model produced non-finite attention statistics ({name}): "
                                     "check the model's weights and inputs")
            if kept[:, i].size and np.abs(kept[:, i]).max() >= _LIMIT:
                raise AttnscopeError(f"{name} reached {np.abs(kept[:, i]).max():.3g}, "
                                     "beyond the exact range of the sums")
        q = np.rint(kept * SCALE).astype(np.int64).reshape(len(kept), -1)  # [document, metric * layer * head]
        cells = (len(names), self.layers, self.heads)
        for start in range(0, q.shape[0], _CHUNK):
            total, squares = _exact_sums(q[start:start + _CHUNK])
            for name, t, s in zip(names, total.reshape(cells), squares.reshape(cells), strict=True):
                self.total[name] = self.total[name] + t
                self.squares[name] = self.squares[name] + s
        for name, n in zip(names, ok.sum(0).tolist(), strict=True):
            self.count[name] += n

    def merge(self, other: StatsState) -> StatsState:
        """A new state holding both; exact, associative and commutative."""
        if (self.layers, self.heads, self.metrics, self.settings) != (
            other.layers, other.heads, other.metrics, other.settings
        ):
            raise AttnscopeError("cannot merge statistics from different models, metrics or settings")
        out = StatsState(self.layers, self.heads, self.metrics, dict(self.settings))
        for name in self.metrics:
            out.count[name] = self.count[name] + other.count[name]
            out.total[name] = self.total[name] + other.total[name]
            out.squares[name] = self.squares[name] + other.squares[name]
        out.documents = self.documents + other.documents
        out.tokens = self.tokens + other.tokens
        out.truncated = self.truncated + other.truncated
        if self.syntax is not None and other.syntax is not None:
            out.syntax = self.syntax.merge(other.syntax)
        else:
            out.syntax = self.syntax or other.syntax
        return out

    def mean(self, name: str) -> np.ndarray:
        """float64 [layer, head]: the mean over documents (NaN where no document counts)."""
        return self._cells(name, lambda n, s, _q: s / (n * SCALE))

    def std(self, name: str) -> np.ndarray:
        """float64 [layer, head]: the population standard deviation over documents."""
        return self._cells(name, lambda n, s, q: math.sqrt((n * q - s * s) / (n * n * SCALE * SCALE)))

    def _cells(self, name: str, fn: Any) -> np.ndarray:
        out = np.full((self.layers, self.heads), np.nan)
        for layer in range(self.layers):
            for head in range(self.heads):
                n = int(self.count[name][layer, head])
                if n:
                    out[layer, head] = fn(n, int(self.total[name][layer, head]),
                                          int(self.squares[name][layer, head]))
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (integers of any size stay exact in JSON)."""
        return {
            "layers": self.layers, "heads": self.heads, "metrics": list(self.metrics),
            "settings": self.settings, "documents": self.documents, "tokens": self.tokens,
            "truncated": self.truncated, "scale": SCALE,
            "count": {k: v.tolist() for k, v in self.count.items()},
            "total": {k: v.tolist() for k, v in self.total.items()},
            "squares": {k: v.tolist() for k, v in self.squares.items()},
            "syntax": self.syntax.to_dict() if self.syntax is not None else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StatsState:
        if int(data.get("scale", 0)) != SCALE:
            raise AttnscopeError("this checkpoint was written with another number format: start a new run")
        state = cls(int(data["layers"]), int(data["heads"]), tuple(data["metrics"]), dict(data["settings"]))
        for name in state.metrics:
            state.count[name] = np.asarray(data["count"][name], dtype=np.int64)
            state.total[name] = _ints_from(data["total"][name])
            state.squares[name] = _ints_from(data["squares"][name])
        state.documents, state.tokens = int(data["documents"]), int(data["tokens"])
        state.truncated = int(data["truncated"])
        if data.get("syntax") is not None:
            state.syntax = SyntaxCounts.from_dict(data["syntax"])
        return state


_BITS = 21  # q = a 2^42 + b 2^21 + c, |a| < 2^20, 0 <= b, c < 2^21: a product of two limbs is below 2^43
_CHUNK = 2**19  # documents summed at once in int64: 2^19 products below 2^43 stay below 2^62


def _exact_sums(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sum of q, sum of q^2) over the documents of q [document, ...] int64, as Python ints [...].

    Summed in int64 limb by limb (exact, and much faster than summing Python ints), then put together."""
    mask = (1 << _BITS) - 1
    a, b, c = q >> 2 * _BITS, (q >> _BITS) & mask, q & mask
    limbs = np.stack([a, b, c, a * a, a * b, 2 * a * c + b * b, b * c, c * c]).sum(axis=1).astype(object)
    sa, sb, sc, aa, ab, ac_bb, bc, cc = limbs
    total = (sa << 2 * _BITS) + (sb << _BITS) + sc
    squares = (aa << 4 * _BITS) + (ab << 3 * _BITS + 1) + (ac_bb << 2 * _BITS) + (bc << _BITS + 1) + cc
    return total, squares


def _ints(shape: tuple[int, int]) -> np.ndarray:
    out = np.empty(shape, dtype=object)
    out.fill(0)
    return out


def _ints_from(rows: list[list[int]]) -> np.ndarray:
    out = _ints((len(rows), len(rows[0]) if rows else 0))
    for i, row in enumerate(rows):
        for j, value in enumerate(row):
            out[i, j] = int(value)
    return out


def merge_all(states: list[StatsState]) -> StatsState:
    """Merge any number of states (in any order: the result is the same)."""
    if not states:
        raise AttnscopeError("no statistics to merge")
    out = states[0]
    for s in states[1:]:
        out = out.merge(s)
    return out
