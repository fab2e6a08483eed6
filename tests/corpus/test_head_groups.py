"""Heads grouped by what they do: the JS distance is scipy's, hand-made heads with known patterns cluster and are
labelled as they should, and two models' heads are matched by behaviour (no model: the numbers are made here)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.distance import jensenshannon

from attnscope.corpus.head_groups import classical_mds, compare, groups
from attnscope.corpus.head_sums import js_pairs
from tests.support.heads import hand_made_sums


def test_the_js_distance_is_scipys() -> None:
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(6), size=(4, 5))  # [unit, token, key]
    p[1, 2] = p[0, 2]  # two equal rows: distance exactly 0
    p[3, :, 4:] = 0.0  # zeros in the support
    p[3] /= p[3].sum(-1, keepdims=True)
    got = js_pairs(p)  # [token, unit, unit]
    want = np.array([[[jensenshannon(p[a, t], p[b, t]) for b in range(4)] for a in range(4)] for t in range(5)])
    assert np.abs(got - want).max() <= 1e-12
    assert got[2, 0, 1] == 0.0 and (got == got.transpose(0, 2, 1)).all()


@pytest.mark.parametrize("causal", [False, True])
def test_hand_made_heads_cluster_by_kind_and_get_their_labels(causal: bool) -> None:
    g = groups(hand_made_sums(causal), None, "hand-made", causal, clusters=3)
    kinds = np.repeat(np.arange(3), 3)
    # the three clusters are the three kinds: same kind <=> same cluster
    assert ((kinds[:, None] == kinds[None]) == (g.clusters[:, None] == g.clusters[None])).all()
    # every head is nearer to each head of its kind than to any head of another kind
    d = g.distance
    for u in range(9):
        same = [v for v in range(9) if kinds[v] == kinds[u] and v != u]
        other = [v for v in range(9) if kinds[v] != kinds[u]]
        assert d[u, same].max() < d[u, other].min()
    want = {0: ["previous"], 1: ["first/special"], 2: ["broad"]}
    for u in range(9):
        got = [lab for lab in g.labels[u] if lab != "self"]  # causal row 0 (and a previous head's) is its own token
        assert got == want[int(kinds[u])], (u, g.labels[u])
    assert g.behaviour["previous"][:3].min() > 0.9 and g.behaviour["first_special"][3:6].min() > 0.9
    assert g.behaviour["broadness"][6:].min() > 0.95
    assert g.label_counts()["previous"] == 3


def test_the_map_keeps_the_kinds_apart() -> None:
    g = groups(hand_made_sums(False), None, "hand-made", False, clusters=3)
    centres = np.stack([g.points[3 * k:3 * k + 3].mean(0) for k in range(3)])
    spread = max(np.linalg.norm(g.points[3 * k:3 * k + 3] - centres[k], axis=1).max() for k in range(3))
    gaps = [np.linalg.norm(centres[a] - centres[b]) for a in range(3) for b in range(a + 1, 3)]
    assert min(gaps) > 4 * spread


def test_classical_mds_recovers_points_in_the_plane() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(10, 2))
    d = np.linalg.norm(x[:, None] - x[None], axis=-1)
    y = classical_mds(d)
    assert np.abs(np.linalg.norm(y[:, None] - y[None], axis=-1) - d).max() <= 1e-9


def test_two_models_heads_are_matched_by_behaviour() -> None:
    a = groups(hand_made_sums(False, seed=1), None, "bidirectional", False, clusters=3)
    b = groups(hand_made_sums(True, seed=2), None, "causal", True, clusters=3)
    c = compare(a, b)
    assert c.columns == ("previous", "next", "first_special", "broadness")  # no trees: no syntax column
    assert c.counts["previous"] == (3, 3) and c.counts["broad"] == (3, 3)
    for row in c.nearest:  # each head's nearest head of the other model is one of its kind
        assert int(row["head"].split(".")[1]) // 3 == int(row["other"].split(".")[1]) // 3
