"""Query/key maps of a head (AttentionViz, Yeh et al. 2023): the head's queries and keys from the index in one 2-D
projection (torch-free; the first piece of issue 33's part 3: the data, without its views yet).

AttentionViz's normalisation, applied before the projection so that queries and keys share one space:
- keys are translated by t = mean(q) - mean(k): for any query, q . (k + t) = q . k + q . t, the same shift for
  every key, so each query's ranking of keys (and its softmax, which ignores a constant shift) is unchanged;
- queries are scaled by c and keys by 1 / c, with c^2 = mean |k + t| / mean |q|, so both have the same mean norm;
  q . k is unchanged by that.
The projection is PCA (the joint points centred, their top two right singular vectors), each axis' sign fixed so its
largest coordinate is positive, so the same index gives the same picture.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnscope.corpus.search import check_query
from attnscope.corpus.store import CorpusIndex


@dataclass(frozen=True, kw_only=True)
class QKMap:
    """A head's queries and keys in 2-D: points [2 * token, 2], the first half queries, the second keys (of the same
    tokens, index rows `rows`); `explained`: the share of the joint variance each axis keeps."""

    layer: int
    head: int
    rows: np.ndarray  # [token]
    points: np.ndarray  # [2 * token, 2]
    explained: tuple[float, float]
    translation: np.ndarray  # [d_head], added to every key
    scale: float  # queries times it, keys divided by it

    def to_dict(self) -> dict[str, Any]:
        n = len(self.rows)
        return {"layer": self.layer, "head": self.head, "rows": self.rows.tolist(),
                "queries": self.points[:n].tolist(), "keys": self.points[n:].tolist(),
                "explained": list(self.explained), "scale": self.scale}


def normalise(q: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """AttentionViz's normalisation of queries q [token, d_head] and keys k [token, d_head] (module docstring).
    -> (q', k', translation, scale), in float64."""
    q, k = np.asarray(q, dtype=np.float64), np.asarray(k, dtype=np.float64)
    translation = q.mean(0) - k.mean(0)
    moved = k + translation
    q_norm = float(np.linalg.norm(q, axis=1).mean())
    scale = float(np.sqrt(np.linalg.norm(moved, axis=1).mean() / q_norm)) if q_norm > 0 else 1.0
    return q * scale, moved / scale, translation, scale


def pca_2d(x: np.ndarray) -> tuple[np.ndarray, tuple[float, float]]:
    """x [point, dim] -> (its projection on the top two principal axes [point, 2], each axis' share of variance)."""
    centred = x - x.mean(0)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    axes = vt[:2]  # [2, dim]
    signs = np.sign(axes[np.arange(len(axes)), np.abs(axes).argmax(1)])  # largest coordinate positive
    axes = axes * signs[:, None]
    total = float((s**2).sum()) or 1.0
    shares = [float(v**2 / total) for v in s[:2]] + [0.0, 0.0]
    return centred @ axes.T, (shares[0], shares[1])


def qk_map(index: CorpusIndex, layer: int, head: int, limit: int | None = None, seed: int = 0) -> QKMap:
    """The query/key map of one kept head at one kept layer (0-indexed), over every token of the index or a seeded
    sample of `limit` of them."""
    check_query(index, layer, "query", head)
    slot = index.heads.index(head)
    rows = np.arange(index.n_tokens)
    if limit is not None and limit < len(rows):
        rows = np.sort(np.random.default_rng(seed).choice(len(rows), limit, replace=False))
    q = np.asarray(index.array(f"query.l{layer}")[rows, slot])  # [token, d_head]
    k = np.asarray(index.array(f"key.l{layer}")[rows, slot])
    qn, kn, translation, scale = normalise(q, k)
    points, explained = pca_2d(np.concatenate([qn, kn]))
    return QKMap(layer=layer, head=head, rows=rows, points=points, explained=explained, translation=translation,
                 scale=scale)


__all__ = ["QKMap", "normalise", "pca_2d", "qk_map"]
