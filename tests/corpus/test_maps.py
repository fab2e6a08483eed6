"""Query/key maps: AttentionViz's normalisation keeps each query's ranking of keys; the projection is PCA."""

from __future__ import annotations

import numpy as np
import pytest

from attnscope.corpus.maps import normalise, pca_2d, qk_map
from attnscope.corpus.store import CorpusIndex
from attnscope.errors import AttnscopeError


@pytest.mark.parametrize(("layer", "head"), [(0, 1), (3, 4)])
def test_the_normalisation_keeps_each_querys_ranking_of_keys(index: CorpusIndex, layer: int, head: int) -> None:
    slot = index.heads.index(head)
    q = np.asarray(index.array(f"query.l{layer}")[:300, slot], dtype=np.float64)
    k = np.asarray(index.array(f"key.l{layer}")[:300, slot], dtype=np.float64)
    qn, kn, _, scale = normalise(q, k)
    before, after = q @ k.T, qn @ kn.T  # [query, key]
    shift = after - before  # q . t for each query: the same for every key
    assert np.abs(shift - shift[:, :1]).max() <= 1e-9 * np.abs(before).max()
    tolerance = 1e-9 * np.abs(after).max()
    for b, a in zip(before, after, strict=True):  # keys in this query's order before: still in order after
        assert np.diff(a[np.argsort(b, kind="stable")]).min() >= -tolerance
    assert scale > 0 and abs(np.linalg.norm(qn, axis=1).mean() - np.linalg.norm(kn, axis=1).mean()) <= 1e-9
    assert np.allclose(kn.mean(0) * scale, q.mean(0), atol=1e-9)  # keys sit on the queries' centroid


def test_pca_on_a_hand_made_plane() -> None:
    rng = np.random.default_rng(0)
    plane = rng.normal(size=(200, 2)) * [5.0, 2.0]  # variance 25 and 4 along two axes
    basis = np.linalg.qr(rng.normal(size=(6, 6)))[0][:2]  # [2, 6] orthonormal rows
    points, explained = pca_2d(plane @ basis + 3.0)
    assert abs(sum(explained) - 1.0) <= 1e-9 and explained[0] > explained[1]
    # the projection recovers the plane up to a rotation: pairwise distances are kept
    d = np.linalg.norm(points[:, None] - points[None], axis=-1)
    want = np.linalg.norm(plane[:, None] - plane[None], axis=-1)
    assert np.abs(d - want).max() <= 1e-9


def test_a_map_of_the_index(index: CorpusIndex) -> None:
    m = qk_map(index, 3, 4, limit=200)
    assert m.points.shape == (400, 2) and len(m.rows) == 200 and 0 < m.explained[1] <= m.explained[0] < 1
    assert qk_map(index, 3, 4, limit=200).points.tolist() == m.points.tolist()  # seeded: the same picture
    assert len(m.to_dict()["queries"]) == 200
    with pytest.raises(AttnscopeError, match="not head=2"):
        qk_map(index, 3, 2)
