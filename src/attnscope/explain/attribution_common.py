"""What the attribution walkthroughs share (attnscope.explain.attribution and its method modules): the Walk a
method's builder reads, the Built it returns, the check record, and how vectors are shown."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from attnscope.attribution.methods import Settings
from attnscope.attribution.objective import ENCODER, Objective
from attnscope.attribution.record import MethodScores
from attnscope.explain.steps import Step

DIMS = 6  # the first dimensions of a vector shown
SAME = 1e-9  # |walkthrough - attribute()| for a number both compute the same way in float64 from the same tensors
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)  # integrated gradients: the path points shown (the nearest the rule uses)


def check(name: str, value: float, bound: float, detail: str, ok: bool | None = None) -> dict[str, Any]:
    """One check: value <= bound passes (NaN fails) unless ok says otherwise (None: NOT VERIFIED)."""
    passed = bool(value <= bound) if ok is None and not np.isnan(value) else ok if ok is not None else False
    return {"name": name, "value": float(value), "bound": float(bound), "ok": passed, "detail": detail}


def method_check(ms: MethodScores) -> dict[str, Any]:
    """attribute()'s own check of the method, as a walkthrough check."""
    c = ms.check
    return {"name": f"{ms.method}: {c.name}", "value": c.value, "bound": c.bound, "ok": c.verified,
            "detail": c.detail}


@dataclass
class Walk:
    """What a method's builder gets: the objective, token I, the layer asked for, settings, attribute()'s result."""

    obj: Objective
    token: int
    layer: int | None
    settings: Settings
    scores: MethodScores

    @property
    def labels(self) -> list[str]:
        return [f"{i}:{t.text}" for i, t in enumerate(self.obj.tokens)]

    @property
    def label(self) -> str:
        return self.labels[self.token]

    @property
    def reference(self) -> float:
        """attribute()'s score of token I for the first target."""
        return float(self.scores.scores[0, self.token])

    @property
    def row(self) -> int | None:
        """The position whose output predicts the first target; None for an encoder (the mean of the rows)."""
        return None if self.obj.kind == ENCODER else self.obj.positions[0]


Built = tuple[list[Step], float, list[dict[str, Any]], int, float]
# steps, the final number, checks, the layer shown (-1: none), the bound on |final - attribute()| (relative)
Builder = Callable[[Walk], Built]


def head_dims(v: torch.Tensor | np.ndarray, n: int = DIMS) -> np.ndarray:
    """The first n entries of the last axis, as float64."""
    a = v.detach().double().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v, dtype=np.float64)
    return np.asarray(a[..., :n])


def dim_labels(n: int = DIMS) -> list[str]:
    return [f"d{i}" for i in range(n)]
