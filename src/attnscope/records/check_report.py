"""The result of a check: max errors per layer, head and stage, and the verdict (torch-free).

`attnscope.verify.check` computes them; saved traces, views and the web app read them from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnscope.errors import AttnscopeError, validate_index

TOLERANCE = 1e-5  # float32: max abs error allowed between two computations of one number
EPSILON = {"float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}  # each dtype's machine epsilon


def tolerance_for(dtype: str = "float32") -> float:
    """The check's tolerance for a model run in dtype: TOLERANCE in units of the dtype's epsilon.

    float32's 1e-5 is 84 float32 epsilons; bfloat16 and float16 get 84 of theirs (0.66 and 0.082).
    The model computes each stage in its dtype and the check recomputes it in float32 from the same
    inputs and weights, so the error measured is the model's own rounding (docs/models.md).
    """
    if dtype not in EPSILON:
        raise AttnscopeError(f"dtype={dtype!r} has no stated tolerance: use one of {', '.join(EPSILON)}",
                             parameter="dtype")
    return TOLERANCE * EPSILON[dtype] / EPSILON["float32"]


# The verdicts of a check, and the exit codes of `attnscope check` for each (2 is bad input).
PASS, FAIL, NOT_VERIFIED = "PASS", "FAIL", "NOT VERIFIED"
EXIT_CODES = {PASS: 0, FAIL: 1, NOT_VERIFIED: 3}

# A score q.k sums d_head products; float32 rounds it to within a few ulps of sum |q_i k_i| <= |q| |k|
# (reaching 400 on real text, where float32 steps are 3e-5). So score errors are measured relative to
# that bound, |a - b| / max(1, |q| |k|). The output is the same kind of dot product, merged_i . W_O[:, j],
# and reaches |200| in deep decoders (SmolLM2), where one float32 step is 1.5e-5: its errors are measured
# relative to max(1, |merged_i| |W_O[:, j]|). Every other stage is compared in absolute terms.
RELATIVE = ("scores", "output")


@dataclass(frozen=True)
class Comparison:
    """One stage computed two ways. errors: [layer, head] for per-head stages, [layer, 1] otherwise."""

    stage: str
    source: str  # what the captured numbers are compared with: "recompute" or "model"
    errors: np.ndarray
    relative: bool = False  # errors are |a - b| / max(1, |q| |k|) rather than |a - b|

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
    def verified(self) -> bool:
        """True when the independent recompute ran: comparing captured numbers with the model's own
        outputs alone proves nothing about the maths."""
        return self.unsupported is None and any(c.source == "recompute" for c in self.comparisons)

    @property
    def status(self) -> str:
        """FAIL when any comparison exceeds the tolerance; else NOT VERIFIED without a recompute; else PASS."""
        if not self.ok:
            return FAIL
        return PASS if self.verified else NOT_VERIFIED

    @property
    def max_error(self) -> float:
        return max((c.max_error for c in self.comparisons), default=0.0)

    def worst(self, stage: str, source: str = "recompute") -> float | None:
        for c in self.comparisons:
            if c.stage == stage and c.source == source:
                return c.max_error
        return None

    def head_error(self, layer: int, head: int) -> float:
        """Max error over every comparison for one layer and head (0-indexed; a per-layer comparison counts for
        each of its heads); NaN when any of them is NaN."""
        if not self.comparisons:
            return 0.0
        validate_index("layer", layer, max(int(c.errors.shape[0]) for c in self.comparisons), owner="this check")
        validate_index("head", head, max(int(c.errors.shape[1]) for c in self.comparisons), owner="this check")
        errs = [c.errors[layer, min(head, c.errors.shape[1] - 1)] for c in self.comparisons]
        return float(np.max(errs))  # NaN propagates, where max() would keep whichever came first

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "status": self.status,
            "verified": self.verified,
            "tolerance": self.tolerance,
            "max_error": self.max_error,
            "unsupported": self.unsupported,
            "comparisons": [
                {"stage": c.stage, "source": c.source, "max_error": c.max_error,
                 "measure": "relative" if c.relative else "absolute", "errors": c.errors.tolist()}
                for c in self.comparisons
            ],
        }


def report_from_dict(data: dict[str, Any]) -> CheckReport:
    """Rebuild a stored report (a saved trace keeps its verification)."""
    report = CheckReport(tolerance=float(data["tolerance"]), unsupported=data.get("unsupported"))
    for c in data.get("comparisons", []):
        errors = np.asarray(c["errors"], dtype=np.float64)
        report.comparisons.append(Comparison(c["stage"], c["source"], errors, c.get("measure") == "relative"))
    return report
