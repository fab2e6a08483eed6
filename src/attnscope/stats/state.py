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
    documents: int = 0
    tokens: int = 0  # tokens read by the model (after truncation, special tokens included)
    truncated: int = 0
    syntax: SyntaxCounts | None = None
    # The sums of q and q^2 per metric, in two parts: Python ints [layer, head], and the int64 limb sums
    # [limb, layer, head] (see _limb_sums) of the documents added since, which are cheap to add to.
    # `total` and `squares` fold the limbs in; so does adding more documents than the limbs can hold.
    _sums: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)
    _limbs: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    _limb_documents: int = 0

    def __post_init__(self) -> None:
        for name in self.metrics:
            if name not in self.count:
                self.count[name] = np.zeros((self.layers, self.heads), dtype=np.int64)
            if name not in self._sums:
                self._sums[name] = _ints((self.layers, self.heads)), _ints((self.layers, self.heads))
            if name not in self._limbs:
                self._limbs[name] = np.zeros((_N_LIMBS, self.layers, self.heads), dtype=np.int64)

    @property
    def total(self) -> dict[str, np.ndarray]:
        """Python ints [layer, head] per metric: the sum of q."""
        self._fold()
        return {name: sums[0] for name, sums in self._sums.items()}

    @property
    def squares(self) -> dict[str, np.ndarray]:
        """Python ints [layer, head] per metric: the sum of q^2."""
        self._fold()
        return {name: sums[1] for name, sums in self._sums.items()}

    def _fold(self) -> None:
        """Move the limb sums into the Python-int sums (the value is the same)."""
        if self._limb_documents:
            for name in self.metrics:
                total, squares = _from_limbs(self._limbs[name])
                self._sums[name] = self._sums[name][0] + total, self._sums[name][1] + squares
                self._limbs[name] = np.zeros_like(self._limbs[name])
            self._limb_documents = 0

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
        for start in range(0, q.shape[0], _CHUNK):
            part = q[start:start + _CHUNK]
            if self._limb_documents + len(part) > _CHUNK:
                self._fold()
            limbs = _limb_sums(part).reshape(_N_LIMBS, len(names), self.layers, self.heads)
            for i, name in enumerate(names):
                self._limbs[name] = self._limbs[name] + limbs[:, i]
            self._limb_documents += len(part)
        for name, n in zip(names, ok.sum(0).tolist(), strict=True):
            self.count[name] += n

    def merge(self, other: StatsState) -> StatsState:
        """A new state holding both; exact, associative and commutative."""
        if (self.layers, self.heads, self.metrics, self.settings) != (
            other.layers, other.heads, other.metrics, other.settings
        ):
            raise AttnscopeError("cannot merge statistics from different models, metrics or settings")
        if self._limb_documents + other._limb_documents > _CHUNK:
            self._fold()
            other._fold()
        out = StatsState(self.layers, self.heads, self.metrics, dict(self.settings))
        for name in self.metrics:
            out.count[name] = self.count[name] + other.count[name]
            mine, theirs = self._sums[name], other._sums[name]
            out._sums[name] = mine[0] + theirs[0], mine[1] + theirs[1]
            out._limbs[name] = self._limbs[name] + other._limbs[name]
        out._limb_documents = self._limb_documents + other._limb_documents
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
        total, squares = self.total[name], self.squares[name]
        for layer in range(self.layers):
            for head in range(self.heads):
                n = int(self.count[name][layer, head])
                if n:
                    out[layer, head] = fn(n, int(total[layer, head]), int(squares[layer, head]))
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
            state._sums[name] = _ints_from(data["total"][name]), _ints_from(data["squares"][name])
        state.documents, state.tokens = int(data["documents"]), int(data["tokens"])
        state.truncated = int(data["truncated"])
        if data.get("syntax") is not None:
            state.syntax = SyntaxCounts.from_dict(data["syntax"])
        return state


_BITS = 21  # q = a 2^42 + b 2^21 + c, |a| <= 2^20, 0 <= b, c < 2^21: a product of two limbs is below 2^43
_N_LIMBS = 8
_CHUNK = 2**19  # documents whose limb sums int64 holds: 2^19 products below 2^43 stay below 2^62


def _limb_sums(q: np.ndarray) -> np.ndarray:
    """The sums over documents of the limbs of q and of q^2, q [document, ...] int64 -> int64 [limb, ...]:
    a, b, c, a*a, a*b, 2*a*c + b*b, b*c, c*c (exact in int64 for up to _CHUNK documents)."""
    mask = (1 << _BITS) - 1
    a, b, c = q >> 2 * _BITS, (q >> _BITS) & mask, q & mask
    sums: np.ndarray = np.stack([a, b, c, a * a, a * b, 2 * a * c + b * b, b * c, c * c]).sum(axis=1)
    return sums


def _from_limbs(limbs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sum of q, sum of q^2) as Python ints [...] from their limb sums [limb, ...]."""
    sa, sb, sc, aa, ab, ac_bb, bc, cc = limbs.astype(object)
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
