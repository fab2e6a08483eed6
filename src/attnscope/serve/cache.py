"""A small LRU cache of recent traces, bounded in entries and in bytes of arrays."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from attnscope.traces import Trace

CacheKey = tuple[str, str, str | None, int, bool]  # model, text, pair, max_length, truncate


@dataclass
class Entry:
    """One traced text with its verification; views payloads are added on first use."""

    trace: Trace
    check: dict[str, Any]
    payloads: dict[tuple[str, ...], dict[str, Any]] = field(default_factory=dict)  # by optional sources

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.trace.arrays.values())


class TraceCache:
    """Thread-safe; the least recently used entries leave first."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._items: OrderedDict[CacheKey, Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: CacheKey) -> Entry | None:
        with self._lock:
            entry = self._items.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return entry

    def put(self, key: CacheKey, entry: Entry) -> None:
        with self._lock:
            self._items[key] = entry
            self._items.move_to_end(key)
            while self._items and (len(self._items) > self.max_entries or self._bytes() > self.max_bytes):
                self._items.popitem(last=False)

    def _bytes(self) -> int:
        return sum(e.nbytes for e in self._items.values())

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"entries": len(self._items), "bytes": self._bytes(), "max_entries": self.max_entries,
                    "max_bytes": self.max_bytes, "hits": self.hits, "misses": self.misses}
