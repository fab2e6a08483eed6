"""Dependency-head accuracy on hand-built word maps, both directions, and the fixed-offset baseline."""

from __future__ import annotations

import numpy as np
import torch

from attnscope.stats.syntax import OFFSETS, SyntaxBatch, SyntaxCounts, best_heads, fold_layers, layer_correct


def test_predictions_in_both_directions() -> None:
    # units: [CLS] w0 w1 w2 [SEP]; gold: w0 <- w1 (det), w2 <- w1 (obj); w1 is root (not scored)
    maps = torch.tensor([[[
        [0.9, 0.0, 0.1, 0.0, 0.0],
        [0.0, 0.1, 0.8, 0.1, 0.0],  # w0 attends most to w1 (its head): dep->head right
        [0.0, 0.5, 0.1, 0.1, 0.3],  # w1 attends most to w0 among words (not [SEP], not itself)
        [0.0, 0.3, 0.3, 0.4, 0.0],  # w2: w0 and w1 tie, the first (w0) wins: dep->head wrong
        [0.2, 0.2, 0.2, 0.2, 0.2],
    ]]], dtype=torch.float32)
    sb = SyntaxBatch(
        gold=torch.tensor([[-1, 2, -1, 2, -1]]),
        relation=torch.tensor([[[0, 0], [1, 0], [0, 0], [0, 1], [0, 0]]], dtype=torch.float64),
        candidates=torch.tensor([[False, True, True, True, False]]),
        names=["det", "obj"],
    )
    got = layer_correct(maps, sb)  # [direction, head, relation]
    # dep->head: det right, obj wrong. head->dep: column w0 is attended most by w1 (right);
    # in column w2, w0 and w1 tie at 0.1 and the first (w0) wins, so obj is wrong.
    assert got[0, 0].tolist() == [1.0, 0.0]
    assert got[1, 0].tolist() == [1.0, 0.0]
    counts = SyntaxCounts(1, 1, total={"det": 1, "obj": 1},
                          correct={n: np.zeros((2, 1, 1), dtype=np.int64) for n in ("det", "obj")},
                          offset_correct={n: np.zeros(len(OFFSETS), dtype=np.int64) for n in ("det", "obj")})
    counts.offset_correct["det"][OFFSETS.index(1)] = 1
    fold_layers(counts, [got], sb)
    best = {r["relation"]: r for r in best_heads(counts)}
    assert best["det"]["accuracy"] == 1.0 and best["det"]["direction"] == "dep->head"
    assert best["det"]["baseline_offset"] == 1 and best["det"]["baseline_accuracy"] == 1.0
    assert best["all"]["count"] == 2 and best["all"]["accuracy"] == 0.5


def test_counts_merge_by_relation() -> None:
    a = SyntaxCounts(1, 2)
    a._relation("det")
    a.total["det"] = 3
    a.correct["det"][0, 0, 1] = 2
    b = SyntaxCounts(1, 2)
    b._relation("nsubj")
    b.total["nsubj"] = 1
    merged = a.merge(b)
    assert merged.total == {"det": 3, "nsubj": 1}
    assert merged.to_dict() == b.merge(a).to_dict()
    assert SyntaxCounts.from_dict(merged.to_dict()).to_dict() == merged.to_dict()
