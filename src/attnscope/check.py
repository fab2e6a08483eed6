"""Compare recompute vs capture vs the model's own outputs: max abs error per layer, head and stage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

TOLERANCE = 1e-5  # float32: max abs error allowed between two computations of one number

PER_HEAD = ("q", "k", "v", "scores", "weights", "context")  # arrays [layer, head, ...]
PER_LAYER = ("x", "output")  # arrays [layer, token, d_model]
# Logits reach |400| on real text, where float32 itself only resolves steps of 3e-5, so their
# error is measured relative to the value: |a - b| / max(1, |b|). Every other stage is absolute.
RELATIVE = ("scores",)


@dataclass(frozen=True)
class Comparison:
    """One stage computed two ways. errors: [layer, head] for per-head stages, [layer, 1] otherwise."""

    stage: str
    source: str  # what the captured numbers are compared with: "recompute" or "model"
    errors: np.ndarray
    relative: bool = False  # errors are |a - b| / max(1, |b|) rather than |a - b|

    @property
    def max_error(self) -> float:
        return float(self.errors.max()) if self.errors.size else 0.0


@dataclass
class CheckReport:
    """The verification of one trace."""

    tolerance: float
    comparisons: list[Comparison] = field(default_factory=list)
    unsupported: str | None = None  # why the independent recompute did not run, if it did not

    @property
    def ok(self) -> bool:
        """True when every comparison is within tolerance (NaN never is)."""
        return all(bool(np.all(c.errors <= self.tolerance)) for c in self.comparisons)

    @property
    def max_error(self) -> float:
        return max((c.max_error for c in self.comparisons), default=0.0)

    def worst(self, stage: str, source: str = "recompute") -> float | None:
        for c in self.comparisons:
            if c.stage == stage and c.source == source:
                return c.max_error
        return None

    def head_error(self, layer: int, head: int) -> float:
        """Max error over every per-head comparison for one layer and head."""
        errs = [float(c.errors[layer, min(head, c.errors.shape[1] - 1)]) for c in self.comparisons]
        return max(errs, default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "tolerance": self.tolerance,
            "max_error": self.max_error,
            "unsupported": self.unsupported,
            "comparisons": [
                {"stage": c.stage, "source": c.source, "max_error": c.max_error,
                 "measure": "relative" if c.relative else "absolute", "errors": c.errors.tolist()}
                for c in self.comparisons
            ],
        }


def max_abs_error(a: np.ndarray, b: np.ndarray, per_head: bool, relative: bool = False) -> np.ndarray:
    """Max |a - b| reduced to [layer, head] (per-head arrays) or [layer, 1]; NaN propagates."""
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    if relative:
        diff /= np.maximum(1.0, np.abs(b.astype(np.float64)))
    axes = tuple(range(2, diff.ndim)) if per_head else tuple(range(1, diff.ndim))
    if diff.size == 0:
        return np.zeros(diff.shape[:2] if per_head else (diff.shape[0], 1))
    # np.max propagates NaN, so a NaN anywhere makes that entry fail the tolerance.
    out: np.ndarray = diff.max(axis=axes)
    return out if per_head else out[:, None]


def compare(
    captured: dict[str, np.ndarray],
    others: dict[str, np.ndarray],
    source: str,
) -> list[Comparison]:
    """Compare every stage present in both dicts."""
    out = []
    for stage in (*PER_LAYER[:1], *PER_HEAD, *PER_LAYER[1:]):
        if stage in captured and stage in others:
            per_head = stage in PER_HEAD
            rel = stage in RELATIVE
            errors = max_abs_error(captured[stage], others[stage], per_head, rel)
            out.append(Comparison(stage, source, errors, rel))
    return out


def report_from_dict(data: dict[str, Any]) -> CheckReport:
    """Rebuild a stored report (a saved trace keeps its verification)."""
    report = CheckReport(tolerance=float(data["tolerance"]), unsupported=data.get("unsupported"))
    for c in data.get("comparisons", []):
        errors = np.asarray(c["errors"], dtype=np.float64)
        report.comparisons.append(Comparison(c["stage"], c["source"], errors, c.get("measure") == "relative"))
    return report
