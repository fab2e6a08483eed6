"""Search a corpus index for the tokens nearest to one token of a text, by what the model computes (exBERT-style).

The query token goes through the same path as the corpus did (attnscope.stats.batching and
attnscope.corpus.vectors.batch_rows), so a sentence of the corpus finds its own tokens at distance 0. Distances are
cosine distances, 1 - cos(query, token). Exact search (the reference) reads the index's memory-mapped vectors in
chunks and computes in float64; the approximate index (attnscope.corpus.ann) answers faster when built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnscope.corpus import ann as ann_lib
from attnscope.corpus.store import BY, PER_HEAD, CorpusIndex
from attnscope.corpus.summary import MatchSummary, summarise
from attnscope.errors import AttnscopeError

CHUNK_ROWS = 65536  # rows of vectors read at once by exact search


@dataclass(frozen=True, kw_only=True)
class Match:
    """One corpus token near the query: its row in the index, its distance, and where it is."""

    rank: int  # 0 = nearest
    row: int
    distance: float
    document: int  # row of documents.jsonl
    where: str  # file:line of its document
    text: str  # its document's text
    start: int  # the token's characters in text
    end: int
    position: int  # the token's index in its document (special tokens included, 0-indexed)
    upos: str | None
    deprel: str | None

    @property
    def token(self) -> str:
        return self.text[self.start:self.end]

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "row": self.row, "distance": self.distance, "document": self.document,
                "where": self.where, "text": self.text, "start": self.start, "end": self.end, "token": self.token,
                "position": self.position, "upos": self.upos, "deprel": self.deprel}


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """The query, how it was searched, the matches (nearest first) and their summary."""

    text: str
    token: int
    token_text: str
    layer: int
    by: str
    head: int | None
    method: str  # "exact" or "approximate (LIBRARY)"
    matches: list[Match]
    summary: MatchSummary

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "token": self.token, "token_text": self.token_text, "layer": self.layer,
                "by": self.by, "head": self.head, "method": self.method,
                "matches": [m.to_dict() for m in self.matches], "summary": self.summary.to_dict()}


def vector_name(by: str, layer: int) -> str:
    return f"{by}.l{layer}"


def check_query(index: CorpusIndex, layer: int, by: str, head: int | None) -> None:
    """One line naming what the index holds when the query asks for something else (layer, head, --by)."""
    if by not in BY:
        raise AttnscopeError(f"by={by!r} is not one of {', '.join(BY)}", parameter="by")
    if layer not in index.layers:
        raise AttnscopeError(f"{index.root} holds layers {_listed(index.layers)} (0-indexed), not layer={layer}: "
                             "search one of those, or build an index that keeps it", parameter="layer")
    if by in PER_HEAD:
        if head is None:
            raise AttnscopeError(f"by={by!r} compares per-head vectors: give head=H, one of {_listed(index.heads)} "
                                 "(0-indexed)", parameter="head")
        if head not in index.heads:
            raise AttnscopeError(f"{index.root} holds the q and k of heads {_listed(index.heads)} (0-indexed), not "
                                 f"head={head}: search one of those, or build an index that keeps it",
                                 parameter="head")
    elif head is not None:
        raise AttnscopeError(f"by={by!r} compares whole-layer vectors: head={head} applies to by='query' and by='key'",
                             parameter="head")


def vectors(index: CorpusIndex, by: str, layer: int, head: int | None) -> np.ndarray:
    """The index's vectors a search compares: [token, dim] (a memory map, or a view of one)."""
    data = index.array(vector_name(by, layer))
    if by in PER_HEAD:
        assert head is not None
        return data[:, index.heads.index(head), :]  # [token, d_head] of that head
    return data


def exact_search(data: np.ndarray, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k rows of data [token, dim] nearest to query [dim] by cosine distance, computed in float64, nearest
    first (ties: the lower row first). A row of zeros is at distance 1. -> (rows, distances)."""
    q = np.asarray(query, dtype=np.float64)
    q = q / (np.linalg.norm(q) or 1.0)
    distances = np.empty(data.shape[0], dtype=np.float64)
    for start in range(0, data.shape[0], CHUNK_ROWS):
        chunk = np.asarray(data[start:start + CHUNK_ROWS], dtype=np.float64)  # [rows, dim]
        norms = np.linalg.norm(chunk, axis=1)
        distances[start:start + len(chunk)] = 1.0 - (chunk @ q) / np.where(norms > 0, norms, 1.0)
    k = min(k, len(distances))
    best = np.argpartition(distances, k - 1)[:k] if k < len(distances) else np.arange(len(distances))
    order = np.lexsort((best, distances[best]))
    rows = best[order]
    return rows, distances[rows]


def find(index: CorpusIndex, query: np.ndarray, *, layer: int, by: str = "embedding", head: int | None = None,
         k: int = 50, exact: bool = False) -> tuple[np.ndarray, np.ndarray, str]:
    """The k nearest rows to a query vector, their distances, and the method used (exact, or the ANN index's)."""
    check_query(index, layer, by, head)
    if k < 1:
        raise AttnscopeError(f"k={k} must be at least 1", parameter="k")
    name = vector_name(by, layer)
    if not exact and ann_lib.has(index.manifest, name):
        rows, distances = ann_lib.search(index, name, query, k)
        return rows, distances, f"approximate ({index.manifest['ann']['library']})"
    rows, distances = exact_search(vectors(index, by, layer, head), query, k)
    return rows, distances, "exact"


def matches(index: CorpusIndex, rows: np.ndarray, distances: np.ndarray) -> list[Match]:
    """The matches of rows found in the index, with their sentences and labels."""
    cols = index.columns
    upos, deprel = index.vocab["upos"], index.vocab["deprel"]
    out = []
    for rank, (row, distance) in enumerate(zip(rows.tolist(), distances.tolist(), strict=True)):
        doc = index.document(int(cols["doc"][row]))
        u, d = int(cols["upos"][row]), int(cols["deprel"][row])
        out.append(Match(rank=rank, row=row, distance=float(distance), document=int(cols["doc"][row]),
                         where=str(doc["where"]), text=str(doc["text"]), start=int(cols["start"][row]),
                         end=int(cols["end"][row]), position=int(cols["position"][row]),
                         upos=upos[u] if u >= 0 else None, deprel=deprel[d] if d >= 0 else None))
    return out


def summary_of(found: list[Match]) -> MatchSummary:
    return summarise([m.upos for m in found], [m.deprel for m in found], [m.position for m in found],
                     [m.token for m in found])


def _listed(values: list[int]) -> str:
    return ", ".join(str(v) for v in values)


__all__ = ["BY", "Match", "SearchResult", "check_query", "exact_search", "find", "matches", "summary_of",
           "vector_name", "vectors"]
