"""Heads grouped by what they do, from a heads pass (corpus/heads.py): a hierarchical clustering of the mean
Jensen-Shannon distances (UPGMA, scipy), a 2-D map of the heads (classical MDS of the same distances), a label per
behaviour, and a comparison of two models' heads by a model-independent behaviour vector.

Labels (a head can have several; none of them: "mixed"), from the corpus means of corpus/head_sums.py:
- "previous", "next", "self": at least SHARE of the weight on the key just before, just after, or at the query;
- "first/special": at least SHARE on the first token or on special tokens (the sink);
- "broad": broadness (entropy over log(keys seen)) at least BROAD;
- "syntactic:REL" (CoNLL-U only): the head finds the gold head of relation REL (either direction, stats/syntax.py)
  with accuracy at least SYNTAX_ACCURACY and at least SYNTAX_MARGIN above the best fixed offset's accuracy for REL,
  over at least SYNTAX_MIN_COUNT dependents.
The behaviour vector of a head is [previous, next, first/special, broadness, syntax], syntax being its best accuracy
over all relations together (Clark et al.'s "all"), each in 0..1 whatever the model: two models' heads are compared
by the Euclidean distance of these vectors (syntax left out unless both passes read trees).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.cluster.hierarchy import dendrogram, fcluster, linkage
from scipy.spatial.distance import squareform

from attnscope.corpus.head_sums import FILE, HeadSums, load
from attnscope.errors import AttnscopeError
from attnscope.records.syntax_counts import ALL, SyntaxCounts

SHARE = 0.5
BROAD = 0.8
SYNTAX_ACCURACY = 0.5
SYNTAX_MARGIN = 0.1
SYNTAX_MIN_COUNT = 20
LINKAGE = "average"  # UPGMA: a cluster's distance to another is the mean of their heads' distances
BEHAVIOUR = ("previous", "next", "first_special", "broadness", "syntax")
POSITIONAL = (("previous", "previous"), ("next", "next"), ("self", "self"), ("first_special", "first/special"))


@dataclass(frozen=True, kw_only=True)
class HeadGroups:
    """A model's heads over a corpus. Heads are units u = layer * n_heads + head (0-indexed), named "L.H"."""

    model: str
    layers: int
    heads: int
    causal: bool
    tokens: int
    documents: int
    distance: np.ndarray  # [unit, unit] mean JS distance
    behaviour: dict[str, np.ndarray]  # previous, next, first_special, self, entropy, broadness, syntax: [unit]
    relation: list[str | None]  # each head's best scored relation (CoNLL-U), else None
    labels: list[list[str]]
    linkage: np.ndarray  # scipy linkage [unit - 1, 4]
    clusters: np.ndarray  # [unit] cluster number (1..k) at the cut
    points: np.ndarray  # [unit, 2] classical MDS of the distances

    @property
    def names(self) -> list[str]:
        return [f"{u // self.heads}.{u % self.heads}" for u in range(self.layers * self.heads)]

    def vectors(self, syntax: bool = True) -> np.ndarray:
        """[unit, behaviour] the behaviour vectors (module docstring); syntax=False leaves its column out."""
        names = BEHAVIOUR if syntax else BEHAVIOUR[:-1]
        return np.stack([self.behaviour[n] for n in names], axis=1)

    def label_counts(self) -> dict[str, int]:
        """How many heads carry each label (syntactic labels counted as "syntactic"), "mixed" for none."""
        counts = Counter(lab.split(":")[0] for labs in self.labels for lab in labs)
        counts["mixed"] = sum(1 for labs in self.labels if not labs)
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def dendrogram(self) -> dict[str, Any]:
        """scipy's dendrogram of the linkage as data: icoord, dcoord (segments) and the leaves' order."""
        d = dendrogram(self.linkage, no_plot=True, labels=self.names)
        return {"icoord": d["icoord"], "dcoord": d["dcoord"], "leaves": [int(x) for x in d["leaves"]]}

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (NaN as None)."""
        return {"model": self.model, "layers": self.layers, "heads": self.heads, "causal": self.causal,
                "tokens": self.tokens, "documents": self.documents, "names": self.names,
                "distance": _plain(self.distance), "behaviour": {k: _plain(v) for k, v in self.behaviour.items()},
                "relation": self.relation, "labels": self.labels, "clusters": self.clusters.tolist(),
                "points": _plain(self.points), "dendrogram": self.dendrogram(), "label_counts": self.label_counts()}


def _plain(a: np.ndarray) -> Any:
    """An array as nested lists, NaN as None."""
    if a.ndim == 0:
        v = float(a)
        return v if np.isfinite(v) else None
    return [_plain(x) for x in a] if a.ndim > 1 else [float(v) if np.isfinite(v) else None for v in a]


def syntax_scores(counts: SyntaxCounts | None, units: int) -> tuple[np.ndarray, list[str | None], list[float]]:
    """Per head: the accuracy over all relations (best direction; NaN without trees), the relation it is labelled
    syntactic for (None) and that relation's accuracy (NaN)."""
    if counts is None or not counts.total:
        return np.full(units, np.nan), [None] * units, [float("nan")] * units
    rows = counts.with_all()
    total, correct, _ = rows[ALL]
    overall = (correct.max(0) / total).reshape(units)  # [direction, layer, head] -> [unit]
    best: list[str | None] = [None] * units
    score = [float("nan")] * units
    for name, (n, right, offsets) in rows.items():
        if name == ALL or n < SYNTAX_MIN_COUNT:
            continue
        acc = (right.max(0) / n).reshape(units)
        bar = max(SYNTAX_ACCURACY, float(offsets.max()) / n + SYNTAX_MARGIN)
        for u in np.flatnonzero(acc >= bar):
            if best[u] is None or acc[u] > score[u]:
                best[u], score[u] = name, float(acc[u])
    return overall, best, score


def label(means: dict[str, np.ndarray], relation: list[str | None]) -> list[list[str]]:
    """Each head's labels (module docstring) from its behaviour means and its syntactic relation."""
    out: list[list[str]] = []
    for u in range(len(relation)):
        labs = [name for key, name in POSITIONAL if means[key][u] >= SHARE]
        if means["broadness"][u] >= BROAD:
            labs.append("broad")
        if relation[u] is not None:
            labs.append(f"syntactic:{relation[u]}")
        out.append(labs)
    return out


def classical_mds(distance: np.ndarray) -> np.ndarray:
    """[unit, unit] distances -> [unit, 2] points whose Euclidean distances approximate them best (Torgerson's
    classical MDS: the top two eigenvectors of the double-centred squared distances), each axis' sign fixed so its
    largest coordinate is positive."""
    n = len(distance)
    j = np.eye(n) - 1.0 / n
    b = -0.5 * j @ (distance**2) @ j
    values, vectors = np.linalg.eigh((b + b.T) / 2)
    top = np.argsort(values)[::-1][:2]
    points = vectors[:, top] * np.sqrt(np.maximum(values[top], 0.0))
    signs = np.sign(points[np.abs(points).argmax(0), np.arange(points.shape[1])])
    return np.asarray(points * np.where(signs == 0, 1.0, signs))


def groups(sums: HeadSums, syntax: SyntaxCounts | None, model: str, causal: bool,
           clusters: int | None = None) -> HeadGroups:
    """The grouping of a pass's heads: clusters=k cuts the dendrogram into k groups (default: about sqrt(heads))."""
    distance = sums.distance()
    units = sums.units
    if units < 2:
        raise AttnscopeError("a model with one head has nothing to group")
    k = clusters if clusters is not None else max(2, round(float(np.sqrt(units))))
    if not 1 <= k <= units:
        raise AttnscopeError(f"clusters={k} must be 1..{units} (the model's heads)", parameter="clusters")
    z = linkage(squareform(distance, checks=False), method=LINKAGE)
    means = sums.means()
    overall, relation, _ = syntax_scores(syntax, units)
    return HeadGroups(model=model, layers=sums.layers, heads=sums.heads, causal=causal, tokens=sums.tokens,
                      documents=sums.documents, distance=distance, behaviour={**means, "syntax": overall},
                      relation=relation, labels=label(means, relation), linkage=z,
                      clusters=fcluster(z, k, criterion="maxclust"), points=classical_mds(distance))


def read_groups(path: str | os.PathLike[str], clusters: int | None = None) -> HeadGroups:
    """The grouping of a finished heads pass (OUT/heads.npz, or the directory OUT)."""
    from pathlib import Path

    p = Path(path)
    p = p / FILE if p.is_dir() else p
    sums, meta = load(p)
    if not meta.get("complete"):
        raise AttnscopeError(f"{p} is from a pass that did not finish: run attnscope heads again with --resume")
    syntax = SyntaxCounts.from_dict(meta["syntax"]) if meta.get("syntax") else None
    return groups(sums, syntax, str(meta["model"]), bool(meta["causal"]), clusters)


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Two models' heads side by side: label counts, and for each head of `a` its nearest head of `b` by behaviour."""

    a: str
    b: str
    columns: tuple[str, ...]  # the behaviour vector's parts compared
    counts: dict[str, tuple[int, int]]  # label -> (heads of a, heads of b)
    nearest: list[dict[str, Any]]  # {"head", "other", "distance", "labels", "other_labels"} for every head of a

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "columns": list(self.columns),
                "counts": {k: list(v) for k, v in self.counts.items()}, "nearest": self.nearest}


def compare(a: HeadGroups, b: HeadGroups) -> Comparison:
    """a's heads against b's: label counts and each of a's heads' nearest head of b (Euclidean, behaviour vectors;
    syntax compared only when both have it)."""
    both = bool(np.isfinite(a.behaviour["syntax"]).all() and np.isfinite(b.behaviour["syntax"]).all())
    va, vb = a.vectors(both), b.vectors(both)  # [unit, part]
    d = np.linalg.norm(va[:, None, :] - vb[None, :, :], axis=-1)  # [a unit, b unit]
    ca, cb = a.label_counts(), b.label_counts()
    counts = {k: (ca.get(k, 0), cb.get(k, 0)) for k in dict.fromkeys([*ca, *cb])}
    nearest = []
    for u in range(len(va)):
        v = int(np.argmin(d[u]))
        nearest.append({"head": a.names[u], "other": b.names[v], "distance": float(d[u, v]),
                        "labels": a.labels[u], "other_labels": b.labels[v]})
    return Comparison(a=a.model, b=b.model, columns=BEHAVIOUR if both else BEHAVIOUR[:-1], counts=counts,
                      nearest=nearest)


__all__ = ["BEHAVIOUR", "BROAD", "LINKAGE", "SHARE", "Comparison", "HeadGroups", "classical_mds", "compare",
           "groups", "label", "read_groups", "syntax_scores"]
