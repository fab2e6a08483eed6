"""The faithfulness metrics on hand-made measures with known answers (no model: the measure is a function)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from attnscope.errors import AttnscopeError
from attnscope.faithfulness import metrics as fm

TOL = 1e-12  # float64 sums of a few numbers


def additive(w: np.ndarray) -> fm.Measure:
    """f(keep) = sum of the kept tokens' weights [token]."""
    return lambda keep: keep.astype(np.float64) @ w


def example(w: np.ndarray, special: tuple[int, ...] = (), min_kept: int = 0) -> fm.Example:
    removable = np.ones(len(w), dtype=bool)
    removable[list(special)] = False
    return fm.Example(removable=removable, full=float(w.sum()), min_kept=min_kept)


def aopc_of(order: np.ndarray, ex: fm.Example, f: fm.Measure) -> float:
    return fm.aopc(fm.curves(order, ex, f), ex)


def test_eraser_numbers_by_hand() -> None:
    w = np.array([0.0, 4.0, 1.0, 3.0, 2.0, 0.0])  # token 0 and 5 special ([CLS] and [SEP])
    ex = example(w, special=(0, 5))
    f = additive(w)
    c = fm.curves(fm.ordering(w, ex.removable), ex, f)  # removes 1 (4), 3 (3), 4 (2), 2 (1)
    assert c.deletion.tolist() == [10.0, 6.0, 3.0, 1.0, 0.0]
    assert c.insertion.tolist() == [0.0, 4.0, 7.0, 9.0, 10.0]
    assert fm.bin_counts(ex).tolist() == [1, 1, 1, 1, 2]  # ceil(b% of 4)
    assert fm.comprehensiveness(c, ex).tolist() == [4.0, 4.0, 4.0, 4.0, 7.0]
    assert fm.sufficiency(c, ex).tolist() == [6.0, 6.0, 6.0, 6.0, 3.0]
    assert fm.eraser_aggregate(fm.comprehensiveness(c, ex)) == pytest.approx(23 / 6, abs=TOL)
    assert fm.aopc(c, ex) == pytest.approx((0 + 4 + 7 + 9 + 10) / 5, abs=TOL)
    assert fm.area(c.deletion_x, c.deletion) == pytest.approx(0.25 * (16 + 9 + 4 + 1) / 2, abs=TOL)
    assert fm.area(c.insertion_x, c.insertion) == pytest.approx(0.25 * (4 + 11 + 16 + 19) / 2, abs=TOL)


def test_special_tokens_are_never_removed_and_no_input_is_empty() -> None:
    w = np.array([1.0, 5.0, 2.0, 7.0, 1.0])
    ex = example(w, special=(0, 4))
    order = fm.ordering(-w, ex.removable)
    for keep in (fm.deletion_masks(order, ex), fm.insertion_masks(order, ex)):
        assert keep[:, [0, 4]].all()
    none = example(w, min_kept=1)  # no special token: every mask keeps one removable token
    order = fm.ordering(-w, none.removable)
    for keep in (fm.deletion_masks(order, none), fm.insertion_masks(order, none)):
        assert keep.sum(1).min() == 1
    keep = fm._subset_keep(ex, list(range(8)))
    assert keep[:, [0, 4]].all() and (~keep[:, 1:4]).sum(1).tolist() == [0, 1, 1, 2, 1, 2, 2, 3]


@pytest.mark.parametrize(("m", "exact_tokens"), [(6, 8), (12, 4)])  # exact, then beam search
def test_best_ordering_scores_1_and_worst_0(m: int, exact_tokens: int) -> None:
    w = np.random.default_rng(m).uniform(-1, 3, size=m + 2)
    ex = example(w, special=(0, m + 1))
    f = additive(w)
    scores = {"best": w, "worst": -w, "other": np.random.default_rng(1).normal(size=m + 2)}
    out = fm.evaluate(scores, ex, f, exact_tokens=exact_tokens)
    assert out["best"].naopc == pytest.approx(1.0, abs=TOL) and out["worst"].naopc == pytest.approx(0.0, abs=TOL)
    assert 0 < out["other"].naopc < 1
    assert out["best"].bound == ("exact" if m <= exact_tokens else "beam 2")
    lo, hi, _ = fm.aopc_bounds(ex, f, exact_tokens)  # the search alone finds them (for an additive f greedy is exact)
    assert hi == pytest.approx(out["best"].aopc, abs=TOL) and lo == pytest.approx(out["worst"].aopc, abs=TOL)


def test_exact_bounds_equal_every_permutation_of_a_non_additive_measure() -> None:
    rng = np.random.default_rng(7)
    w, pair = rng.normal(size=6), rng.normal(size=(6, 6))

    def f(keep: np.ndarray) -> np.ndarray:  # with interactions: greedy is not optimal
        k = keep.astype(np.float64)
        return k @ w + np.einsum("vi,ij,vj->v", k, pair, k)

    ex = fm.Example(removable=np.array([False, True, True, True, True, True]), full=float(f(np.ones((1, 6)))[0]))
    every = [aopc_of(np.array(p), ex, f) for p in itertools.permutations(range(1, 6))]
    lo, hi, how = fm.aopc_bounds(ex, f)
    assert how == "exact" and lo == pytest.approx(min(every), abs=TOL) and hi == pytest.approx(max(every), abs=TOL)
    blo, bhi, _ = fm.aopc_bounds(ex, f, exact_tokens=0, beam=1)  # greedy: inside the exact bounds
    assert lo - TOL <= blo and bhi <= hi + TOL


def test_random_orderings_meet_their_expectation() -> None:
    """For an additive f, AOPC = (1/(m+1)) sum_i w_i (m + 1 - r_i), r the rank of token i: E = W/2 and
    Var = (m+1)/12 (m sum w^2 - W^2) / (m+1)^2 (ranks of a random permutation: Var (m^2-1)/12, Cov -(m+1)/12)."""
    m, seeds = 10, 400
    w = np.random.default_rng(3).uniform(0, 1, size=m)
    ex, f = example(w), additive(w)
    lo, hi, _ = fm.aopc_bounds(ex, f, exact_tokens=10)
    values = np.array([aopc_of(fm.ordering(fm.random_scores(m, s), ex.removable), ex, f) for s in range(seeds)])
    total = w.sum()
    mean, var = total / 2, (m + 1) / 12 * (m * (w @ w) - total**2) / (m + 1) ** 2
    half = 4 * math.sqrt(var / seeds)  # 4 standard errors of the mean of 400
    assert abs(values.mean() - mean) <= half
    naopc = (values - lo) / (hi - lo)
    assert abs(naopc.mean() - (mean - lo) / (hi - lo)) <= half / (hi - lo)
    assert values.std() == pytest.approx(math.sqrt(var), rel=0.2)


def test_curves_are_monotone_for_a_measure_that_only_gains_from_tokens() -> None:
    w = np.random.default_rng(5).uniform(0, 1, size=9)
    ex, f = example(w, special=(0,)), additive(w)
    for seed in range(5):
        c = fm.curves(fm.ordering(fm.random_scores(9, seed), ex.removable), ex, f)
        assert (np.diff(c.deletion) <= 0).all() and (np.diff(c.insertion) >= 0).all()
        assert c.deletion[0] == ex.full and c.insertion[-1] == pytest.approx(ex.full, abs=TOL)
    best = fm.curves(fm.ordering(w, ex.removable), ex, f)  # the best ordering: a convex deletion curve
    assert (np.diff(best.deletion, 2) >= -TOL).all()


def test_rank_agreement_equals_scipy_with_and_without_ties() -> None:
    rng = np.random.default_rng(11)
    for a, b in [(rng.normal(size=15), rng.normal(size=15)),
                 (rng.integers(0, 4, 20).astype(float), rng.integers(0, 3, 20).astype(float))]:
        assert fm.spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-12)
        assert fm.kendall(a, b) == pytest.approx(stats.kendalltau(a, b).statistic, abs=1e-12)
    assert math.isnan(fm.spearman(np.ones(4), np.arange(4.0)))


def test_controls_and_refusals() -> None:
    assert fm.ordering(fm.position_scores(6, anchor=5), np.ones(6, dtype=bool)).tolist() == [5, 4, 3, 2, 1, 0]
    assert fm.ordering(fm.position_scores(5, anchor=2), np.ones(5, dtype=bool)).tolist() == [2, 1, 3, 0, 4]
    assert fm.random_scores(8, 0).tolist() != fm.random_scores(8, 1).tolist()
    assert fm.random_scores(8, 0, example=1).tolist() != fm.random_scores(8, 0, example=2).tolist()
    with pytest.raises(AttnscopeError, match="non-finite"):
        fm.ordering(np.array([1.0, np.nan]), np.ones(2, dtype=bool))
    with pytest.raises(AttnscopeError, match="nothing can be taken away"):
        fm.evaluate({"a": np.ones(2)}, example(np.ones(2), special=(0,), min_kept=1), additive(np.ones(2)))
    flat = fm.evaluate({"a": np.arange(3.0)}, example(np.zeros(3)), additive(np.zeros(3)))
    assert math.isnan(flat["a"].naopc)  # no ordering changes the measure: undefined, not 0
