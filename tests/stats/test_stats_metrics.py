"""Each metric on hand-built attention maps, against values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnscope.stats.batching import UnitMaps
from attnscope.stats.metrics import BUILTIN_METRICS, Units, clean, head_classes

TOL = 1e-12

# One document, 4 units: [CLS] "a" "." [SEP], then one padding unit (its row and column are garbage).
A = torch.tensor([[[
    [0.50, 0.25, 0.25, 0.00, 0.9],
    [0.10, 0.20, 0.30, 0.40, 0.9],
    [0.00, 1.00, 0.00, 0.00, 0.9],
    [0.25, 0.25, 0.25, 0.25, 0.9],
    [0.20, 0.20, 0.20, 0.20, 0.2],
]]], dtype=torch.float64)  # [batch 1, head 1, query 5, key 5]


def units(causal: bool = False, width: int = 5, n: int = 4) -> Units:
    valid = torch.tensor([[i < n for i in range(width)]])
    rows = valid.clone()
    if causal:
        rows[0, 0] = False
    kinds = {
        "cls": torch.tensor([[i == 0 and not causal for i in range(width)]]),
        "sep": torch.tensor([[i == 3 and not causal for i in range(width)]]),
        "punct": torch.tensor([[i == 2 for i in range(width)]]),
        "sink": torch.tensor([[i == 0 and causal for i in range(width)]]),
    }
    return Units(valid, rows, kinds, causal)


def value(name: str, maps: torch.Tensor = A, u: Units | None = None) -> float:
    u = u or units()
    got, ok = BUILTIN_METRICS[name].fn(clean(maps, u), u)
    assert bool(ok[0])
    return float(got[0, 0])


def h(row: list[float]) -> float:
    return -sum(p * math.log(p) for p in row if p > 0)


@pytest.mark.parametrize(("name", "expected"), [
    ("cls", (0.50 + 0.10 + 0.00 + 0.25) / 4),
    ("sep", (0.00 + 0.40 + 0.00 + 0.25) / 4),
    ("punct", (0.25 + 0.30 + 0.00 + 0.25) / 4),
    ("self", (0.50 + 0.20 + 0.00 + 0.25) / 4),
    ("prev", (0.10 + 1.00 + 0.25) / 4),  # row 0 has no previous unit: it adds 0
    ("next", (0.25 + 0.30 + 0.00) / 4),  # the last real row's next is padding: 0
    ("entropy", (h([.5, .25, .25]) + h([.1, .2, .3, .4]) + 0.0 + h([.25] * 4)) / 4),
    ("entropy_uniform", math.log(4)),
    ("entropy_cls", h([.5, .25, .25])),
    ("distance", ((0.25 * 1 + 0.25 * 2) + (0.1 * 1 + 0.3 * 1 + 0.4 * 2) + 1.0 * 1 + 0.25 * (3 + 2 + 1)) / 4),
    ("concentration", (0.5 + 0.4 + 1.0 + 0.25) / 4),
])
def test_bidirectional_metrics_by_hand(name: str, expected: float) -> None:
    assert abs(value(name) - expected) <= TOL


def test_causal_rows_skip_row_zero_and_use_per_row_baselines() -> None:
    causal = torch.tensor([[[
        [1.0, 0.0, 0.0, 0.0],
        [0.6, 0.4, 0.0, 0.0],
        [0.5, 0.25, 0.25, 0.0],
        [0.7, 0.1, 0.1, 0.1],
    ]]], dtype=torch.float64)
    u = units(causal=True, width=4, n=4)
    assert abs(value("sink", causal, u) - (0.6 + 0.5 + 0.7) / 3) <= TOL
    assert abs(value("entropy_uniform", causal, u) - (math.log(2) + math.log(3) + math.log(4)) / 3) <= TOL
    expected = (h([.6, .4]) + h([.5, .25, .25]) + h([.7, .1, .1, .1])) / 3
    assert abs(value("entropy", causal, u) - expected) <= TOL
    assert abs(value("prev", causal, u) - (0.6 + 0.25 + 0.1) / 3) <= TOL
    assert value("next", causal, u) == 0.0


def test_a_causal_document_of_one_token_is_not_counted() -> None:
    u = units(causal=True, width=1, n=1)
    _, ok = BUILTIN_METRICS["entropy"].fn(torch.ones(1, 1, 1, 1, dtype=torch.float64), u)
    assert not bool(ok[0])


def test_no_cls_leaves_entropy_cls_undefined() -> None:
    u = units()
    u.kinds["cls"][:] = False
    _, ok = BUILTIN_METRICS["entropy_cls"].fn(clean(A, u), u)
    assert not bool(ok[0])


def test_padding_keys_are_dropped_and_nan_is_kept() -> None:
    assert float(clean(A, units())[0, 0, 0, 4]) == 0.0
    broken = A.clone()
    broken[0, 0, 1, 1] = float("nan")
    got, _ = BUILTIN_METRICS["entropy"].fn(clean(broken, units()), units())
    assert math.isnan(float(got[0, 0]))


def test_word_level_sums_keys_and_averages_queries() -> None:
    # tokens: [CLS] play ##ing [SEP]; words: [CLS] | play+##ing | [SEP]
    tok = torch.tensor([[[
        [0.4, 0.3, 0.2, 0.1],
        [0.1, 0.2, 0.3, 0.4],
        [0.3, 0.3, 0.3, 0.1],
        [0.25, 0.25, 0.25, 0.25],
    ]]], dtype=torch.float64)
    mean_from = torch.tensor([[[1, 0, 0, 0], [0, .5, .5, 0], [0, 0, 0, 1]]], dtype=torch.float64)
    sum_to = mean_from.transpose(1, 2).ceil()
    maps = UnitMaps(mean_from, sum_to, units(width=3, n=3), [[[0], [1, 2], [3]]])
    word = maps.apply(tok)[0, 0]
    expected = torch.tensor([[0.4, 0.5, 0.1], [0.2, 0.55, 0.25], [0.25, 0.5, 0.25]], dtype=torch.float64)
    assert torch.allclose(word, expected, atol=TOL, rtol=0)
    assert torch.allclose(word.sum(-1), torch.ones(3, dtype=torch.float64), atol=TOL, rtol=0)


def test_head_classes_follow_the_documented_thresholds() -> None:
    def grid(v: list[float]) -> np.ndarray:
        return np.array([v])

    means = {
        "entropy": grid([2.9, 0.1, 0.1, 0.1]), "entropy_uniform": grid([3.0, 3.0, 3.0, 3.0]),
        "prev": grid([0.1, 0.51, 0.5, 0.0]), "next": grid([0.0, 0.0, 0.0, 0.0]),
        "cls": grid([0.0, 0.0, 0.61, 0.0]), "sep": grid([0.0, 0.0, 0.0, 0.0]),
        "punct": grid([0.0, 0.0, 0.0, 0.7]),
    }
    assert head_classes(means) == [[["broad"], ["previous-token"], ["[CLS]"], ["punctuation"]]]


def random_weights(batch: int = 3, heads: int = 2, n: int = 7, seed: int = 0) -> torch.Tensor:
    """Softmax rows in float32 [batch, head, query, key], some weights tiny, the last key padding (zero)."""
    torch.manual_seed(seed)
    maps = torch.softmax(torch.randn(batch, heads, n, n) * 6, -1)
    maps[..., -1] = 0.0
    return maps


def test_concentration_is_the_row_max_and_keeps_nan() -> None:
    u = units(width=7, n=6)
    maps = random_weights()
    concentration = BUILTIN_METRICS["concentration"].per_row
    assert concentration is not None
    assert torch.equal(concentration(maps, u), maps.max(-1).values)
    for nan in (float("nan"), -float("nan"), (torch.zeros(()) / 0.0).item()):  # either sign bit
        broken = maps.clone()
        broken[0, 1, 2, 3] = nan
        assert math.isnan(float(concentration(broken, u)[0, 1, 2]))


def test_row_metrics_averaged_together_equal_each_metric() -> None:
    """The engine averages every mean-over-rows metric of a layer in one step: the same numbers as each fn."""
    from attnscope.stats.metrics import row_mean

    for causal in (False, True):
        u = units(causal=causal, width=7, n=6)
        maps = clean(random_weights(seed=int(causal)), u)
        row_metrics = [m for m in BUILTIN_METRICS.values() if m.per_row is not None and m.reduce is row_mean]
        together, ok = row_mean(torch.stack([m.per_row(maps, u) for m in row_metrics]), u)
        for metric, values in zip(row_metrics, together, strict=True):
            alone, alone_ok = metric.fn(maps, u)
            assert torch.equal(values, alone) and torch.equal(ok, alone_ok), metric.name


def test_attention_to_a_kind_of_few_keys_equals_the_full_row_sum() -> None:
    from attnscope.stats.metrics import row_attention_to

    maps = random_weights(batch=4, heads=3, n=9)
    valid = torch.ones(4, 9, dtype=torch.bool)
    mixed = torch.zeros(4, 9, dtype=torch.bool)
    mixed[1, 4] = True  # documents with 0, 1 and 2 keys of the kind
    mixed[2, [0, 8]] = True
    mixed[3, [5, 6]] = True
    one_each = torch.zeros(4, 9, dtype=torch.bool)
    one_each[torch.arange(4), torch.tensor([0, 3, 8, 0])] = True
    kinds = {"mixed": mixed, "one_each": one_each, "none": torch.zeros(4, 9, dtype=torch.bool),
             "many": mixed | (torch.arange(9) < 3)}
    u = Units(valid, valid, kinds, False)
    assert u.few_keys("many") is None and all(u.few_keys(k) is not None for k in ("mixed", "one_each", "none"))
    for kind in kinds:
        full = (maps * u.kinds[kind].to(maps.dtype)[:, None, None, :]).sum(-1)
        assert torch.equal(row_attention_to(kind)(maps, u), full), kind
