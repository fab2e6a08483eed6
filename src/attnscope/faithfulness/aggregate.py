"""Corpus aggregates of the per-example rows (torch-free): per method, each metric's mean over examples with a
95% percentile bootstrap interval (examples resampled with replacement, numpy default_rng(seed), B
resamples), the mean curves on a common grid, and the methods' rank agreement (mean Spearman per example).
A NaN value (e.g. NAOPC where no ordering changes the measure, Spearman without leave-one-out) is left out of
its metric and counted, never replaced."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from attnscope.faithfulness.metrics import BINS, spearman

RESAMPLES = 1000
SEED = 0
GRID = np.linspace(0.0, 1.0, 21)  # curves are interpolated onto k/m = 0, 0.05, .., 1

SCALARS = (*(f"comprehensiveness_{b}" for b in BINS), *(f"sufficiency_{b}" for b in BINS),
           "comprehensiveness_aopc", "sufficiency_aopc", "aopc", "naopc", "deletion_area", "insertion_area",
           "spearman_loo", "kendall_loo")


def bootstrap(values: np.ndarray, resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float, float]:
    """(mean, low, high) of values [example] (finite), the interval the 2.5 and 97.5 percentiles of the
    resampled means; NaNs for no values."""
    if values.size == 0:
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, values.size, size=(resamples, values.size))  # [resample, example]
    means = values[picks].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(values.mean()), float(low), float(high)


def curve_bands(curves: Sequence[Sequence[float]], starts: Sequence[float], seed: int = SEED) -> dict[str, Any]:
    """Mean curve and 95% bootstrap band on GRID: each example's curve [step] over x = start .. 1."""
    on_grid = np.array([np.interp(GRID, np.linspace(s, 1.0, len(c)), c) for c, s in zip(curves, starts,
                                                                                        strict=True)])
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(on_grid), size=(RESAMPLES, len(on_grid)))
    means = on_grid[picks].mean(axis=1)  # [resample, grid]
    low, high = np.percentile(means, [2.5, 97.5], axis=0)
    return {"x": GRID.tolist(), "mean": on_grid.mean(axis=0).tolist(), "low": low.tolist(), "high": high.tolist()}


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """{method: {metric: {mean, low, high, n, nan}, deletion: band, insertion: band}} over the rows."""
    out: dict[str, Any] = {}
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        entry: dict[str, Any] = {"examples": len(mine)}
        for name in (n for n in SCALARS if n in mine[0]):  # a run of metrics="agreement" has only the LOO pair
            v = np.array([r[name] for r in mine], dtype=np.float64)
            ok = v[np.isfinite(v)]
            mean, low, high = bootstrap(ok)
            entry[name] = {"mean": mean, "low": low, "high": high, "n": int(ok.size), "nan": int(v.size - ok.size)}
        if "deletion" in mine[0]:
            entry["deletion"] = curve_bands([r["deletion"] for r in mine], [0.0] * len(mine))
            entry["insertion"] = curve_bands([r["insertion"] for r in mine],
                                             [r["min_kept"] / r["removable"] for r in mine])
        out[method] = entry
    return out


def agreement(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The methods' rank agreement: {methods, matrix [method, method]} of the mean Spearman over examples of
    their scores on the removable tokens (NaN pairs left out)."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    by_example: dict[int, dict[str, np.ndarray]] = {}
    for r in rows:
        by_example.setdefault(r["example"], {})[r["method"]] = np.asarray(r["scores"], dtype=np.float64)
    matrix = np.full((len(methods), len(methods)), np.nan)
    for i, a in enumerate(methods):
        for j, b in enumerate(methods):
            rho = np.array([spearman(s[a], s[b]) for s in by_example.values() if a in s and b in s])
            rho = rho[np.isfinite(rho)]
            matrix[i, j] = rho.mean() if rho.size else np.nan
    return {"methods": methods, "matrix": matrix.tolist()}
