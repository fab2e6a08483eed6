"""A small LRU cache of recent traces, bounded in entries and in every byte an entry holds.

An entry grows after it is cached (rollout, flow and norms are computed on request, payloads
are built on first use), so the owner calls `fit()` after each growth and the cap holds then.

A trace no follow-up is expected for (an API request for arrays only) is kept from the second
time its text is asked for: keeping every one-off trace costs a client that sends new texts
~15% of its throughput (each kept trace pins tens of MB among the next forward pass's
temporaries; the heap grows and every page of it faults in) and fills the cache with texts
nobody asks about again.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from attnscope.records.trace import Trace
from attnscope.stages import ARRAY_AXES

CacheKey = tuple[str, str, str | None, int, bool]  # model, text, pair, max_length, truncate
_PER_TOKEN = 512  # bytes a Token record and its strings take, about (the arrays dominate)


@dataclass
class Entry:
    """One traced text with its verification; views payloads (JSON bytes) are added on first use."""

    trace: Trace
    check: dict[str, Any]
    payloads: dict[tuple[str, ...], bytes] = field(default_factory=dict)  # by optional sources

    @property
    def nbytes(self) -> int:
        """Every array the trace holds (derived ones too), its payloads and tokens.

        (Its output projections are views of the model's weights: they cost nothing here.)
        """
        arrays = _array_bytes(self.trace)
        payloads = sum(len(p) for p in self.payloads.values())
        return arrays + payloads + _PER_TOKEN * len(self.trace.tokens)


def _array_bytes(trace: Trace) -> int:
    """Bytes of every array, without laying out stages still pending in the batch (attnscope.records.arrays: reading
    one copies it out, and scores are computed): those are counted from their axes as float32."""
    pending = set(getattr(trace.arrays, "pending", list)())
    sizes = {"token": len(trace.tokens), "query": len(trace.tokens), "key": len(trace.key_tokens or trace.tokens),
             "layer": trace.model.get("layers"), "head": trace.model.get("heads"),
             "kv_head": trace.model.get("kv_heads") or trace.model.get("heads"),
             "d_head": trace.model.get("d_head"), "d_model": trace.model.get("d_model")}
    total = 0
    for name in trace.arrays:
        dims = [sizes.get(a) for a in ARRAY_AXES.get(name, ())] if name in pending else None
        if dims is None or not all(isinstance(d, int) for d in dims):
            total += int(trace.arrays[name].nbytes)  # laid out (or of unknown shape: lay it out to count it)
        else:
            total += 4 * math.prod(dims)  # type: ignore[arg-type]
    return total


class TraceCache:
    """Thread-safe; the least recently used entries leave first."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._items: OrderedDict[CacheKey, Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.evicted = 0
        self.declined = 0  # one-off traces not kept (asked for the first time, no follow-up expected)
        self._seen: OrderedDict[CacheKey, None] = OrderedDict()  # keys of recent one-off traces

    def get(self, key: CacheKey) -> Entry | None:
        with self._lock:
            entry = self._items.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return entry

    def peek(self, key: CacheKey) -> bool:
        """Is it cached? (Counts neither a hit nor a miss, and leaves the order alone.)"""
        with self._lock:
            return key in self._items

    def put(self, key: CacheKey, entry: Entry, follow_up: bool = True) -> None:
        """Keep it, evicting the oldest; an entry over the byte cap alone is not kept (and evicts nothing).
        follow_up=False (no request about it is expected): kept only if its key was put before."""
        with self._lock:
            if not follow_up and self._first_time(key):
                self.declined += 1
                return
            if entry.nbytes > self.max_bytes:
                self._items.pop(key, None)
                return
            self._items[key] = entry
            self._items.move_to_end(key)
            self._fit()

    def _first_time(self, key: CacheKey) -> bool:
        """Is this the first one-off put of key (among the last few hundred)? Remembers it if so."""
        if key in self._seen:
            del self._seen[key]
            return False
        self._seen[key] = None
        while len(self._seen) > max(256, 4 * self.max_entries):
            self._seen.popitem(last=False)
        return True

    def fit(self) -> None:
        """Evict until the caps hold again (after an entry grew)."""
        with self._lock:
            self._fit()

    def clear(self) -> None:
        with self._lock:
            self.evicted += len(self._items)
            self._items.clear()

    def _fit(self) -> None:
        sizes = {k: e.nbytes for k, e in self._items.items()}
        total = sum(sizes.values())
        while self._items and (len(self._items) > self.max_entries or total > self.max_bytes):
            key, _ = self._items.popitem(last=False)
            total -= sizes[key]
            self.evicted += 1

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"entries": len(self._items), "bytes": sum(e.nbytes for e in self._items.values()),
                    "max_entries": self.max_entries, "max_bytes": self.max_bytes, "hits": self.hits,
                    "misses": self.misses, "evicted": self.evicted,
                    "declined": self.declined}
