"""The counts of dependency syntax in attention heads (Clark et al. 2019, section 4.2): exact, mergeable, torch-free.

stats/syntax.py fills them from a corpus pass's word-level maps; this record is what a saved pass keeps
(`to_dict`/`from_dict`) and what readers such as corpus/head_groups.py read without loading torch. Directions:
"dep->head" (the word a dependent attends to most is its gold head) and "head->dep" (the transposed map); OFFSETS:
the fixed relative positions of the baseline. Layers and heads are 0-indexed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnscope.errors import AttnscopeError

DIRECTIONS = ("dep->head", "head->dep")
OFFSETS = (-5, -4, -3, -2, -1, 1, 2, 3, 4, 5)
ALL = "all"  # every scored relation together


@dataclass
class SyntaxCounts:
    """Exact, mergeable counts: per relation, scored dependents and correct predictions."""

    layers: int
    heads: int
    total: dict[str, int] = field(default_factory=dict)
    correct: dict[str, np.ndarray] = field(default_factory=dict)  # int64 [direction, layer, head]
    offset_correct: dict[str, np.ndarray] = field(default_factory=dict)  # int64 [offset]
    unscored: int = 0  # words lost to truncation (or to a tokenizer that gave them no token)

    def relation(self, name: str) -> np.ndarray:
        """The correct counts of one relation, int64 [direction, layer, head]; zeros, added, when it is new."""
        if name not in self.correct:
            self.total[name] = 0
            self.correct[name] = np.zeros((len(DIRECTIONS), self.layers, self.heads), dtype=np.int64)
            self.offset_correct[name] = np.zeros(len(OFFSETS), dtype=np.int64)
        return self.correct[name]

    def merge(self, other: SyntaxCounts) -> SyntaxCounts:
        if (self.layers, self.heads) != (other.layers, other.heads):
            raise AttnscopeError("cannot merge syntax counts of models with different layers or heads")
        out = SyntaxCounts(self.layers, self.heads, unscored=self.unscored + other.unscored)
        for part in (self, other):
            for name in part.total:
                out.relation(name)
                out.total[name] += part.total[name]
                out.correct[name] = out.correct[name] + part.correct[name]
                out.offset_correct[name] = out.offset_correct[name] + part.offset_correct[name]
        return out

    def to_dict(self) -> dict[str, Any]:
        names = sorted(self.total)
        return {
            "layers": self.layers, "heads": self.heads, "unscored": self.unscored,
            "total": {n: self.total[n] for n in names},
            "correct": {n: self.correct[n].tolist() for n in names},
            "offset_correct": {n: self.offset_correct[n].tolist() for n in names},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SyntaxCounts:
        out = cls(int(data["layers"]), int(data["heads"]), unscored=int(data["unscored"]))
        for name, total in data["total"].items():
            out.total[name] = int(total)
            out.correct[name] = np.asarray(data["correct"][name], dtype=np.int64)
            out.offset_correct[name] = np.asarray(data["offset_correct"][name], dtype=np.int64)
        return out

    def with_all(self) -> dict[str, tuple[int, np.ndarray, np.ndarray]]:
        """relation -> (total, correct [direction, layer, head], offset_correct), plus "all"."""
        rows = {n: (self.total[n], self.correct[n], self.offset_correct[n]) for n in self.total}
        if rows:
            rows[ALL] = (
                sum(self.total.values()),
                np.sum([self.correct[n] for n in self.total], axis=0),
                np.sum([self.offset_correct[n] for n in self.total], axis=0),
            )
        return rows


__all__ = ["ALL", "DIRECTIONS", "OFFSETS", "SyntaxCounts"]
