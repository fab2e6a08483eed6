"""Query/key maps of a head (AttentionViz, Yeh et al. 2023): the head's queries and keys from the index in one 2-D
projection (torch-free; the first piece of issue 33's part 3: the data, without its views yet).

AttentionViz's normalisation, applied before the projection so that queries and keys share one space:
- keys are translated by t = mean(q) - mean(k): for any query, q . (k + t) = q . k + q . t, the same shift for
  every key, so each query's ranking of keys (and its softmax, which ignores a constant shift) is unchanged;
- queries are scaled by c and keys by 1 / c, with c^2 = mean |k + t| / mean |q|, so both have the same mean norm;
  q . k is unchanged by that.
The projection is PCA (the joint points centred, their top two right singular vectors), each axis' sign fixed so its
largest coordinate is positive, so the same index gives the same picture. t-SNE (scikit-learn, the `stats` extra) and
UMAP (umap-learn, not a dependency: installed by hand) are offered when importable (`PROJECTIONS`, `available`), seeded
and initialised from the PCA; they keep neighbourhoods, not distances, and explain no share of variance.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnscope.corpus.search import check_query
from attnscope.corpus.store import CorpusIndex
from attnscope.errors import AttnscopeError

PROJECTIONS = {"pca": None, "tsne": "sklearn", "umap": "umap"}  # method -> the module it needs


@dataclass(frozen=True, kw_only=True)
class QKMap:
    """A head's queries and keys in 2-D: points [2 * token, 2], the first half queries, the second keys (of the same
    tokens, index rows `rows`); `explained`: the share of the joint variance each axis keeps."""

    layer: int
    head: int
    rows: np.ndarray  # [token]
    points: np.ndarray  # [2 * token, 2]
    explained: tuple[float, float] | None  # PCA's shares of variance (None for t-SNE and UMAP)
    translation: np.ndarray  # [d_head], added to every key
    scale: float  # queries times it, keys divided by it
    method: str = "pca"

    def to_dict(self) -> dict[str, Any]:
        n = len(self.rows)
        return {"layer": self.layer, "head": self.head, "rows": self.rows.tolist(),
                "queries": self.points[:n].tolist(), "keys": self.points[n:].tolist(),
                "explained": None if self.explained is None else list(self.explained), "scale": self.scale,
                "method": self.method}


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


def available() -> list[str]:
    """The projections this installation offers: pca always, tsne with scikit-learn, umap with umap-learn."""
    return [m for m, module in PROJECTIONS.items() if module is None or importlib.util.find_spec(module) is not None]


def project(x: np.ndarray, method: str = "pca", seed: int = 0) -> tuple[np.ndarray, tuple[float, float] | None]:
    """x [point, dim] -> ([point, 2], PCA's shares of variance or None), by PCA, t-SNE or UMAP (module docstring)."""
    if method not in PROJECTIONS:
        raise AttnscopeError(f"projection {method!r} is not known: choose from {', '.join(PROJECTIONS)}",
                             parameter="method")
    if method not in available():
        raise AttnscopeError(f"the {method} projection needs the {PROJECTIONS[method]} package, which is not "
                             f"installed: pip install {'umap-learn' if method == 'umap' else 'scikit-learn'}, or "
                             "use pca", parameter="method")
    start, explained = pca_2d(x)
    if method == "pca":
        return start, explained
    n = len(x)
    if n < 5:
        raise AttnscopeError(f"{method} needs at least 5 points, the map has {n}: use pca", parameter="method")
    if method == "tsne":
        from sklearn.manifold import TSNE
        from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

        tsne = TSNE(n_components=2, init=start / (np.std(start[:, 0]) or 1.0) * 1e-4, random_state=seed,
                    perplexity=min(30.0, (n - 1) / 3.0))
        # one OpenMP thread: on a busy machine its threads spin (120 points: 1.6 s on one, 42 s on all, load 19)
        with threadpool_limits(limits=1, user_api="openmp"):
            return np.asarray(tsne.fit_transform(x), dtype=np.float64), None
    import umap  # type: ignore[import-not-found]

    reducer = umap.UMAP(n_components=2, random_state=seed, init=start, n_neighbors=min(15, n - 1))
    return np.asarray(reducer.fit_transform(x), dtype=np.float64), None


def qk_map(index: CorpusIndex, layer: int, head: int, limit: int | None = None, seed: int = 0,
           method: str = "pca") -> QKMap:
    """The query/key map of one kept head at one kept layer (0-indexed), over every token of the index or a seeded
    sample of `limit` of them, projected by `method` (pca, tsne or umap: `available()`)."""
    check_query(index, layer, "query", head)
    slot = index.heads.index(head)
    rows = sample_rows(index.n_tokens, limit, seed)
    q = np.asarray(index.array(f"query.l{layer}")[rows, slot])  # [token, d_head]
    k = np.asarray(index.array(f"key.l{layer}")[rows, slot])
    qn, kn, translation, scale = normalise(q, k)
    points, explained = project(np.concatenate([qn, kn]), method, seed)
    return QKMap(layer=layer, head=head, rows=rows, points=points, explained=explained, translation=translation,
                 scale=scale, method=method)


def sample_rows(n_tokens: int, limit: int | None, seed: int = 0) -> np.ndarray:
    """Every token row, or a seeded sample of `limit` of them in index order (the same for every head)."""
    rows = np.arange(n_tokens)
    if limit is not None and limit < len(rows):
        rows = np.sort(np.random.default_rng(seed).choice(len(rows), limit, replace=False))
    return rows


__all__ = ["PROJECTIONS", "QKMap", "available", "normalise", "pca_2d", "project", "qk_map", "sample_rows"]
