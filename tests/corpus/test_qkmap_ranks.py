"""AttentionViz's normalisation keeps every query's ranking of keys exactly, on the real MiniLM queries and keys of the
shared small index; the projections other than PCA are offered only when installed."""

from __future__ import annotations

import numpy as np
import pytest

from attnscope.corpus.maps import available, normalise, project, qk_map
from attnscope.corpus.store import CorpusIndex
from attnscope.errors import AttnscopeError
from tests.support.corpus import HEADS, LAYERS


def ranks(scores: np.ndarray) -> np.ndarray:
    """[query, key] scores -> each key's rank in its query's row (0: the lowest score)."""
    return np.argsort(np.argsort(scores, axis=1, kind="stable"), axis=1, kind="stable")


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("head", HEADS)
def test_each_querys_ranking_of_keys_is_exactly_kept(index: CorpusIndex, layer: int, head: int) -> None:
    slot = index.heads.index(head)
    q = np.asarray(index.array(f"query.l{layer}")[:, slot], dtype=np.float64)  # [token, d_head], every token
    k = np.asarray(index.array(f"key.l{layer}")[:, slot], dtype=np.float64)
    qn, kn, _, _ = normalise(q, k)
    # keys that are the same vector (a [CLS] at position 0 in layer 0, say) tie exactly: rank each distinct key once
    _, first = np.unique(k, axis=0, return_index=True)
    before, after = q @ k[first].T, qn @ kn[first].T  # [query, distinct key]
    shift = after - before  # q . t, the same for every key of a query, up to rounding
    rounding = float(np.abs(shift - shift[:, :1]).max())
    gap = float(np.diff(np.sort(before, axis=1), axis=1).min())  # the closest two keys of any query
    assert gap > 100 * rounding  # so no rounding can swap two keys: the ranks must be equal exactly
    assert np.array_equal(ranks(before), ranks(after))
    assert len(first) > 0.5 * len(k)


def test_the_projections_offered_are_those_installed(index: CorpusIndex) -> None:
    assert available()[0] == "pca"
    if "tsne" in available():  # scikit-learn (the stats extra): seeded, one point per query and per key
        m = qk_map(index, 3, 4, limit=60, method="tsne")
        assert m.points.shape == (120, 2) and m.explained is None and m.method == "tsne"
        assert np.array_equal(qk_map(index, 3, 4, limit=60, method="tsne").points, m.points)
    if "umap" not in available():
        with pytest.raises(AttnscopeError, match="umap-learn"):
            project(np.zeros((10, 4)), "umap")
    with pytest.raises(AttnscopeError, match="not known"):
        project(np.zeros((10, 4)), "mds")
