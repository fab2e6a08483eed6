"""The approximate-nearest-neighbour index of a corpus index's vectors: FAISS HNSW over unit vectors.

Chosen by measurement against usearch and hnswlib on the same vectors (docs/corpus.md): FAISS installs as a wheel
(hnswlib compiles from source on Python 3.11), built fastest, and answered within the latency target at
recall@10 >= 0.95. It is optional (`pip install 'attnscope[corpus]'`): without it an index has no approximate
part and every search is exact, which is the reference anyway. Cosine distance = 1 - inner product of unit vectors.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from attnscope.corpus.store import ANN_DIR
from attnscope.errors import AttnscopeError

if TYPE_CHECKING:
    from attnscope.corpus.store import CorpusIndex

LIBRARY = "faiss"
INSTALL = "pip install 'attnscope[corpus]'"
KINDS = ("embedding", "context")  # the whole-layer vectors that get an approximate index
CONNECTIONS = 16  # HNSW's M: links per node
EF_CONSTRUCTION = 100
EF_SEARCH = 128  # candidates kept while searching (at least 2 k): recall@10 0.970 at 300k tokens, 0.968 at 1M
# (p95 4.5 ms; efSearch 64: 0.957, 256 and 512: 0.968): benchmarks/bench_index.py, docs/corpus.md
ADD_ROWS = 65536

_LOADED: dict[str, Any] = {}  # path -> faiss index, read once per process


def library() -> ModuleType | None:
    """The faiss module, or None when the optional extra is not installed."""
    try:
        import faiss
    except ImportError:
        return None
    return faiss


def build_all(root: Path, manifest: dict[str, Any], kinds: tuple[str, ...] = KINDS) -> dict[str, Any]:
    """An HNSW index per chosen layer for each of `kinds`, written under root/ann; the manifest's "ann" entry
    ({} when there are no kinds or FAISS is not installed: searches are exact)."""
    faiss = library()
    names = [n for n in manifest["arrays"] if n.split(".")[0] in kinds]
    if faiss is None or not names:
        return {}
    (root / ANN_DIR).mkdir(exist_ok=True)
    files = {}
    for name in names:
        entry = manifest["arrays"][name]
        data = np.memmap(root / entry["file"], dtype=np.dtype(entry["dtype"]), mode="r", shape=tuple(entry["shape"]))
        index = faiss.IndexHNSWFlat(int(data.shape[1]), CONNECTIONS, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = EF_CONSTRUCTION
        for start in range(0, data.shape[0], ADD_ROWS):
            index.add(unit_rows(data[start:start + ADD_ROWS]))
        files[name] = {"file": f"{ANN_DIR}/{name}.faiss"}
        faiss.write_index(index, str(root / files[name]["file"]))
    return {"library": LIBRARY, "version": importlib.metadata.version("faiss-cpu"), "kind": "IndexHNSWFlat",
            "metric": "cosine", "M": CONNECTIONS, "ef_construction": EF_CONSTRUCTION, "ef_search": EF_SEARCH,
            "files": files}


def unit_rows(rows: np.ndarray) -> np.ndarray:
    """[row, dim] float32 scaled to unit length (a zero row stays zero)."""
    x = np.asarray(rows, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    out: np.ndarray = np.ascontiguousarray(x / np.where(norms > 0, norms, 1.0), dtype=np.float32)
    return out


def has(manifest: dict[str, Any], name: str) -> bool:
    """Whether the index has an approximate index of this array."""
    return name in manifest.get("ann", {}).get("files", {})


def search(index: CorpusIndex, name: str, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The approximate k nearest rows of array `name` to query [dim], nearest first, with cosine distances."""
    faiss = library()
    if faiss is None:
        raise AttnscopeError(f"{index.root} has a FAISS index but FAISS is not installed: {INSTALL}, or search "
                             "with exact=True", parameter="exact")
    path = index.file(index.manifest["ann"]["files"][name])
    found = _LOADED.get(str(path))
    if found is None:
        found = _LOADED[str(path)] = faiss.read_index(str(path))
    found.hnsw.efSearch = max(EF_SEARCH, 2 * k)
    scores, rows = found.search(unit_rows(np.asarray(query)[None, :]), min(k, found.ntotal))
    keep = rows[0] >= 0
    return rows[0][keep].astype(np.int64), 1.0 - scores[0][keep].astype(np.float64)


__all__ = ["INSTALL", "KINDS", "LIBRARY", "build_all", "has", "library", "search"]
