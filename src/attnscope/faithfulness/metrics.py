"""Faithfulness of a token ordering (torch-free): how much the model's measure moves when the tokens an
explanation ranks highest are taken away, or kept alone.

The model is seen only through `measure`: keep [variant, token] bool (True: the token stays) -> float64
[variant], the explained number of each modified input (attnscope.faithfulness.perturb builds it from the
attribution objective). Special tokens ([CLS], [SEP], BOS) are never removable. `full` is the measure of the
unperturbed input. With m removable tokens, an ordering is the m removable positions, most important first.

Definitions (k counts removed tokens, S_k the first k of the ordering, f the measure):
- deletion curve (Samek et al. 2017; Petsiuk et al. 2018): D[k] = f(x without S_k), k = 0 .. m - min_kept;
  insertion curve: I[k] = f(x with only S_k of the removable tokens), k = min_kept .. m. x-axis: k / m.
  min_kept is 1 when the input cannot be empty (deletion from a text with no special token to keep), else 0.
- comprehensiveness at b% (DeYoung et al. 2020, ERASER): f(x) - D[k_b]; sufficiency at b%: f(x) - I[k_b],
  with k_b = ceil(b/100 m), at most m - min_kept and at least min_kept (so 1% removes one token of a short
  sentence); ERASER's aggregate over the bins B = {1, 5, 10, 20, 50}: the sum over B divided by |B| + 1.
- AOPC (Samek et al. 2017): the mean over every step k = 0 .. K of f(x) - D[k], K = m - min_kept (k = 0 adds 0).
- normalised AOPC (Edin, Motzfeldt, Christensen & Maaloe 2024, "Normalized AOPC: Fixing misleading faithfulness
  metrics for feature attribution explainability", ACL 2025 / arXiv:2408.08137), per example:
  (AOPC - lower) / (upper - lower), upper and lower the AOPC of the best and the worst orderings of that
  example. How they are bounded here (`aopc_bounds`): with m <= exact_tokens, exactly, by dynamic programming
  over every subset of the removable tokens (the measure at all 2^m subsets); beyond, by a beam search of width
  `beam` for the best and for the worst chain of subsets (Edin et al. approximate the bounds by beam search too).
  Then upper is the largest and lower the smallest of that bound and the AOPC of every ordering evaluated on the
  example (every method and control), so 0 <= NAOPC <= 1 by construction, exactly as defined when the bound is
  exact; with a beam bound an evaluated ordering that beats the search defines the bound (and scores 1). NaN
  (undefined) when upper == lower: no ordering changes the measure.
- rank agreement with leave-one-out over the removable tokens: Spearman's rho (Pearson's r of average ranks)
  and Kendall's tau-b, as scipy.stats.spearmanr / kendalltau compute them.
- controls: random orderings (one per seed and example, numpy's default_rng([example, seed]).permutation) and
  the position baseline (the removable tokens nearest an anchor first, ties to the earlier token; the anchor is
  the predicting position for a causal LM, the last token for an encoder).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnscope.errors import AttnscopeError

Measure = Callable[[np.ndarray], np.ndarray]  # keep [variant, token] bool -> [variant] float64
BINS = (1, 5, 10, 20, 50)  # ERASER's percentages of the tokens
EXACT_TOKENS = 8  # exact AOPC bounds up to 2^8 subsets
BEAM = 2  # beam width of the bound search beyond


@dataclass(frozen=True, kw_only=True)
class Example:
    """One input as the metrics see it: which tokens may be removed and the unperturbed measure."""

    removable: np.ndarray  # [token] bool (special tokens False)
    full: float  # f(x)
    min_kept: int = 0  # removable tokens every modified input keeps (1: an input cannot be empty)

    @property
    def n_tokens(self) -> int:
        return int(self.removable.shape[0])

    @property
    def m(self) -> int:
        return int(self.removable.sum())

    @property
    def steps(self) -> int:
        """K: the most tokens any curve removes."""
        return self.m - self.min_kept


@dataclass(frozen=True, kw_only=True)
class Curves:
    """One ordering's deletion and insertion curves, x = k / m."""

    deletion_x: np.ndarray  # [step] k / m, k = 0 .. K
    deletion: np.ndarray  # [step] f(x without S_k)
    insertion_x: np.ndarray  # [step] k / m, k = min_kept .. m
    insertion: np.ndarray  # [step] f(x with only S_k)


def ordering(scores: np.ndarray, removable: np.ndarray) -> np.ndarray:
    """scores [token] -> the removable positions [m], highest score first, ties to the earlier token."""
    if not np.isfinite(scores[removable]).all():
        raise AttnscopeError("an attribution gave a non-finite score to a removable token: it orders nothing")
    where = np.flatnonzero(removable)  # [m]
    return where[np.lexsort((where, -scores[where]))]


def deletion_masks(order: np.ndarray, ex: Example) -> np.ndarray:
    """keep [step, token]: step k removes the first k of the ordering, k = 0 .. K."""
    keep = np.ones((ex.steps + 1, ex.n_tokens), dtype=bool)
    for k in range(1, ex.steps + 1):
        keep[k:, order[k - 1]] = False
    return keep


def insertion_masks(order: np.ndarray, ex: Example) -> np.ndarray:
    """keep [step, token]: step j keeps the specials and the first min_kept + j of the ordering."""
    keep = np.tile(~ex.removable, (ex.m - ex.min_kept + 1, 1))  # [step, token]
    for j in range(ex.m - ex.min_kept + 1):
        keep[j, order[:ex.min_kept + j]] = True
    return keep


def curves(order: np.ndarray, ex: Example, measure: Measure) -> Curves:
    """Both curves of one ordering, in one call of the measure."""
    dele, ins = deletion_masks(order, ex), insertion_masks(order, ex)
    values = np.asarray(measure(np.concatenate([dele, ins])), dtype=np.float64)  # [step + step]
    return curves_from(values, ex)


def curves_from(values: np.ndarray, ex: Example) -> Curves:
    """Curves from the measure of deletion_masks then insertion_masks, concatenated: [2 (K + 1)]."""
    k = ex.steps + 1
    return Curves(deletion_x=np.arange(k) / ex.m, deletion=values[:k],
                  insertion_x=np.arange(ex.min_kept, ex.m + 1) / ex.m, insertion=values[k:])


def bin_counts(ex: Example, bins: Sequence[int] = BINS) -> np.ndarray:
    """[bin]: tokens taken away (or kept) at each percentage: ceil(b/100 m) within [max(1, min_kept), K]."""
    k = np.array([math.ceil(b * ex.m / 100) for b in bins])
    out: np.ndarray = np.clip(k, max(1, ex.min_kept), ex.steps)
    return out


def comprehensiveness(c: Curves, ex: Example, bins: Sequence[int] = BINS) -> np.ndarray:
    """[bin] f(x) - f(x without the top k_b)."""
    out: np.ndarray = ex.full - c.deletion[bin_counts(ex, bins)]
    return out


def sufficiency(c: Curves, ex: Example, bins: Sequence[int] = BINS) -> np.ndarray:
    """[bin] f(x) - f(x with only the top k_b)."""
    out: np.ndarray = ex.full - c.insertion[bin_counts(ex, bins) - ex.min_kept]
    return out


def eraser_aggregate(per_bin: np.ndarray) -> float:
    """ERASER's aggregate comprehensiveness (or sufficiency): sum over the bins / (|B| + 1)."""
    return float(per_bin.sum() / (per_bin.shape[0] + 1))


def aopc(c: Curves, ex: Example) -> float:
    """Mean over k = 0 .. K of f(x) - D[k]."""
    return float(np.mean(ex.full - c.deletion))


def area(x: np.ndarray, y: np.ndarray) -> float:
    """Trapezoid area under a curve [step] over its x [step] (k / m)."""
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))


def normalised(value: float, lower: float, upper: float) -> float:
    """(AOPC - lower) / (upper - lower); NaN when upper == lower."""
    return (value - lower) / (upper - lower) if upper > lower else math.nan


# --- the bounds of AOPC over every ordering ---

def aopc_bounds(ex: Example, measure: Measure, exact_tokens: int = EXACT_TOKENS,
                beam: int = BEAM) -> tuple[float, float, str]:
    """(lower, upper, how): the AOPC of the worst and best orderings; exact for m <= exact_tokens."""
    if ex.m <= exact_tokens:
        return (*_exact_bounds(ex, measure), "exact")
    lo = _beam_bound(ex, measure, beam, best=False)
    hi = _beam_bound(ex, measure, beam, best=True)
    return lo, hi, f"beam {beam}"


def _subset_keep(ex: Example, subsets: Sequence[int]) -> np.ndarray:
    """keep [variant, token] for bitmasks over the removable tokens (bit i: removable token i removed)."""
    where = np.flatnonzero(ex.removable)
    bits = (np.asarray(subsets, dtype=np.int64)[:, None] >> np.arange(ex.m)) & 1  # [variant, m]
    keep = np.ones((len(subsets), ex.n_tokens), dtype=bool)
    keep[:, where] = bits == 0
    return keep


def _exact_bounds(ex: Example, measure: Measure) -> tuple[float, float]:
    """Dynamic programming over subsets: V(S) = g(S) + best/worst V(S + i), g(S) = f(x) - f(x without S)."""
    subsets = [s for s in range(1 << ex.m) if bin(s).count("1") <= ex.steps]
    gain = dict(zip(subsets, ex.full - np.asarray(measure(_subset_keep(ex, subsets)), dtype=np.float64),
                    strict=True))
    gain[0] = 0.0  # f(x) - f(x): the unperturbed input, by definition
    best: dict[int, float] = {}
    worst: dict[int, float] = {}
    for s in sorted(subsets, key=lambda s: -bin(s).count("1")):
        children = [s | 1 << i for i in range(ex.m) if not s >> i & 1 and (s | 1 << i) in gain]
        best[s] = gain[s] + (max(best[c] for c in children) if children else 0.0)
        worst[s] = gain[s] + (min(worst[c] for c in children) if children else 0.0)
    return worst[0] / (ex.steps + 1), best[0] / (ex.steps + 1)


def _beam_bound(ex: Example, measure: Measure, width: int, best: bool) -> float:
    """A beam search over chains of subsets for the largest (best) or smallest sum of g; its AOPC."""
    sign = 1.0 if best else -1.0
    beams: list[tuple[float, int]] = [(0.0, 0)]  # (sum of g so far, subset)
    for _ in range(ex.steps):
        parents: dict[int, float] = {}
        for total, s in beams:
            for i in range(ex.m):
                child = s | 1 << i
                if not s >> i & 1 and (child not in parents or sign * total > sign * parents[child]):
                    parents[child] = total
        children = list(parents)
        gains = ex.full - np.asarray(measure(_subset_keep(ex, children)), dtype=np.float64)  # [child]
        scored = [(parents[c] + float(g), c) for c, g in zip(children, gains, strict=True)]
        beams = sorted(scored, key=lambda t: (-sign * t[0], t[1]))[:width]
    return beams[0][0] / (ex.steps + 1)


# --- rank agreement ---

def average_ranks(x: np.ndarray) -> np.ndarray:
    """[n] -> [n] ranks 1..n, ties given their mean rank."""
    order = np.argsort(x, kind="stable")
    sx = x[order]
    ranks = np.empty(len(x), dtype=np.float64)
    start = 0
    for end in range(1, len(x) + 1):
        if end == len(x) or sx[end] != sx[start]:
            ranks[order[start:end]] = (start + end + 1) / 2
            start = end
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rho of [n] and [n]: Pearson's r of their average ranks (NaN if either is constant)."""
    ra, rb = average_ranks(a) - (len(a) + 1) / 2, average_ranks(b) - (len(b) + 1) / 2
    den = math.sqrt(float(ra @ ra) * float(rb @ rb))
    return float(ra @ rb) / den if den > 0 else math.nan


def kendall(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's tau-b of [n] and [n]: (concordant - discordant) / sqrt((n0 - ties a) (n0 - ties b))."""
    i, j = np.triu_indices(len(a), k=1)  # every pair
    da, db = np.sign(a[i] - a[j]), np.sign(b[i] - b[j])  # [pair]
    num = float((da * db).sum())
    den = math.sqrt(float((da != 0).sum()) * float((db != 0).sum()))
    return num / den if den > 0 else math.nan


# --- controls ---

def random_scores(n_tokens: int, seed: int, example: int = 0) -> np.ndarray:
    """[token] a random ordering as scores: a permutation of 0 .. n-1 from default_rng([example, seed]) (each
    example its own: one permutation per length would order every equally long example the same way)."""
    return np.random.default_rng([example, seed]).permutation(n_tokens).astype(np.float64)


def position_scores(n_tokens: int, anchor: int) -> np.ndarray:
    """[token] the position baseline: -|i - anchor|, ties (one each side) to the earlier token."""
    i = np.arange(n_tokens)
    out: np.ndarray = -np.abs(i - anchor) + (i < anchor) * 0.5
    return out


# --- everything for one example ---

@dataclass(frozen=True, kw_only=True)
class Result:
    """One ordering's numbers on one example."""

    curves: Curves
    comprehensiveness: np.ndarray  # [bin]
    sufficiency: np.ndarray  # [bin]
    aopc: float
    naopc: float
    spearman: float  # with leave-one-out (NaN without it)
    kendall: float
    bound: str = "exact"  # how NAOPC's bounds were found: "exact" or "beam W"

    def to_row(self, bins: Sequence[int] = BINS) -> dict[str, Any]:
        """Flat JSON-able numbers (the curves as lists)."""
        row: dict[str, Any] = {f"comprehensiveness_{b}": float(v) for b, v in zip(bins, self.comprehensiveness,
                                                                                   strict=True)}
        row.update({f"sufficiency_{b}": float(v) for b, v in zip(bins, self.sufficiency, strict=True)})
        c = self.curves
        row.update(comprehensiveness_aopc=eraser_aggregate(self.comprehensiveness),
                   sufficiency_aopc=eraser_aggregate(self.sufficiency), aopc=self.aopc, naopc=self.naopc,
                   deletion_area=area(c.deletion_x, c.deletion), insertion_area=area(c.insertion_x, c.insertion),
                   spearman_loo=self.spearman, kendall_loo=self.kendall, naopc_bound=self.bound,
                   deletion=c.deletion.tolist(), insertion=c.insertion.tolist())
        return row


def evaluate(scores: dict[str, np.ndarray], ex: Example, measure: Measure, loo: np.ndarray | None = None,
             exact_tokens: int = EXACT_TOKENS, beam: int = BEAM, bins: Sequence[int] = BINS) -> dict[str, Result]:
    """Every ordering's metrics on one example: scores {name: [token]}, loo [token] (leave-one-out scores)."""
    if ex.steps < 1:
        raise AttnscopeError(f"{ex.m} removable token(s): nothing can be taken away")
    orders = {name: ordering(s, ex.removable) for name, s in scores.items()}
    masks = [np.concatenate([deletion_masks(o, ex), insertion_masks(o, ex)]) for o in orders.values()]
    values = np.asarray(measure(np.concatenate(masks)), dtype=np.float64)  # every ordering in one call
    per = np.split(values, len(orders))
    found = {name: curves_from(v, ex) for name, v in zip(orders, per, strict=True)}
    aopcs = {name: aopc(c, ex) for name, c in found.items()}
    lo, hi, how = aopc_bounds(ex, measure, exact_tokens, beam)
    lo, hi = min(lo, *aopcs.values()), max(hi, *aopcs.values())
    out = {}
    for name, c in found.items():
        rho = tau = math.nan
        if loo is not None:
            rho = spearman(scores[name][ex.removable], loo[ex.removable])
            tau = kendall(scores[name][ex.removable], loo[ex.removable])
        out[name] = Result(curves=c, comprehensiveness=comprehensiveness(c, ex, bins),
                           sufficiency=sufficiency(c, ex, bins), aopc=aopcs[name],
                           naopc=normalised(aopcs[name], lo, hi), spearman=rho, kendall=tau, bound=how)
    return out
