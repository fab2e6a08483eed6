"""The aggregate state: exact mean/std, exact order-independent merge, lossless serialisation."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from attnscope.errors import AttnscopeError
from attnscope.stats.state import StatsState, merge_all

METRICS = ("entropy", "distance")


def filled(values: np.ndarray) -> StatsState:
    s = StatsState(2, 3, METRICS, {"model": "m"})
    for name in METRICS:
        s.add(name, values, np.ones(values.shape[0], dtype=bool))
    s.documents = values.shape[0]
    return s


def test_mean_and_std_match_numpy() -> None:
    rng = np.random.default_rng(0)
    values = rng.uniform(0, 5, size=(50, 2, 3))
    s = filled(values)
    assert np.abs(s.mean("entropy") - values.mean(0)).max() <= 1e-9
    assert np.abs(s.std("entropy") - values.std(0)).max() <= 1e-9
    assert (s.count["entropy"] == 50).all()


def test_merge_is_exact_and_order_independent() -> None:
    rng = np.random.default_rng(1)
    parts = [filled(rng.uniform(0, 500, size=(n, 2, 3))) for n in (1, 7, 13, 2, 30)]
    reference = merge_all(parts).to_dict()
    for seed in range(5):
        order = parts[:]
        random.Random(seed).shuffle(order)
        assert merge_all(order).to_dict() == reference
    left = parts[0].merge(parts[1]).merge(parts[2])
    right = parts[0].merge(parts[1].merge(parts[2]))
    assert left.to_dict() == right.to_dict()


def test_round_trip_through_json_is_lossless() -> None:
    s = filled(np.random.default_rng(2).uniform(0, 9, size=(20, 2, 3)))
    back = StatsState.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back.to_dict() == s.to_dict()
    assert np.array_equal(back.mean("distance"), s.mean("distance"))


def test_undefined_documents_are_not_counted() -> None:
    s = StatsState(1, 1, ("entropy",))
    s.add("entropy", np.array([[[1.0]], [[3.0]]]), np.array([True, False]))
    assert int(s.count["entropy"][0, 0]) == 1 and s.mean("entropy")[0, 0] == 1.0


def test_nan_is_an_error_and_mismatched_states_do_not_merge() -> None:
    s = StatsState(1, 1, ("entropy",))
    with pytest.raises(AttnscopeError, match="non-finite"):
        s.add("entropy", np.array([[[np.nan]]]), np.array([True]))
    with pytest.raises(AttnscopeError, match="cannot merge"):
        s.merge(StatsState(1, 1, ("entropy",), {"model": "other"}))


def test_sums_equal_python_integer_sums() -> None:
    """The int64 limb sums give exactly the sums of Python integers, up to the largest allowed values."""
    from attnscope.stats.state import SCALE

    rng = np.random.default_rng(3)
    for magnitude in (1.0, 300.0, 2.0**29):
        values = rng.uniform(-magnitude, magnitude, size=(64, 2, 3))
        values[0, 0, 0] = np.nextafter(2.0**30, 0)  # the extremes the fixed point allows
        values[1, 0, 0] = -np.nextafter(2.0**30, 0)
        s = filled(values)
        q = [[[round(v * SCALE) for v in row] for row in doc] for doc in values.tolist()]
        for layer in range(2):
            for head in range(3):
                column = [doc[layer][head] for doc in q]
                assert s.total["entropy"][layer, head] == sum(column)
                assert s.squares["entropy"][layer, head] == sum(x * x for x in column)


def test_add_many_equals_one_add_per_metric() -> None:
    rng = np.random.default_rng(4)
    values = rng.uniform(0, 50, size=(9, 2, 2, 3))  # [document, metric, layer, head]
    ok = rng.random((9, 2)) > 0.3
    values[~ok] = np.nan  # undefined values are never read
    together = StatsState(2, 3, METRICS, {"model": "m"})
    together.add_many(list(METRICS), values, ok)
    apart = StatsState(2, 3, METRICS, {"model": "m"})
    for i, name in enumerate(METRICS):
        apart.add(name, values[:, i], ok[:, i])
    assert together.to_dict() == apart.to_dict()
    assert together.count["distance"][0, 0] == ok[:, 1].sum()


def test_sums_stay_exact_when_the_int64_limbs_fill_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for 5 documents in the limb sums, batches and merges fold them into Python ints on the way."""
    from attnscope.stats import state as state_module

    monkeypatch.setattr(state_module, "_CHUNK", 5)
    rng = np.random.default_rng(5)
    batches = [rng.uniform(-2.0**29, 2.0**29, size=(n, 2, 3)) for n in (3, 4, 7, 1, 5, 2)]
    parts = [filled(values) for values in batches]
    merged = merge_all(parts[:3]).merge(merge_all(parts[3:]))
    one = StatsState(2, 3, METRICS, {"model": "m"})
    for values in batches:
        one.add("entropy", values, np.ones(len(values), dtype=bool))
    everything = np.concatenate(batches)
    q = [[[round(v * state_module.SCALE) for v in row] for row in doc] for doc in everything.tolist()]
    for state in (merged, one):
        for layer in range(2):
            for head in range(3):
                column = [doc[layer][head] for doc in q]
                assert state.total["entropy"][layer, head] == sum(column)
                assert state.squares["entropy"][layer, head] == sum(x * x for x in column)
    assert StatsState.from_dict(merged.to_dict()).to_dict() == merged.to_dict()
