"""A trace's arrays: one text's stages laid out [layer, ...], cut from the padded batch on first use (torch-free).

A forward pass leaves each stage as one [batch, ...] tensor per layer. `TraceArrays` keeps
those tensors and copies a text's rows into a contiguous numpy array [layer, ...] (padding
cut off, axes in ARRAY_AXES) the first time the stage is read. Checking a trace needs none
of these copies, so `attnscope check` never pays for them; a view or a saved file pays once.
Once every stage is read, the trace holds only its own arrays, not the batch. `token_index` is the one rule
for cutting a text's tokens out of any stage (tracing.rows cuts batches with it, records.generation a prefix).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import numpy as np

from attnscope.stages import ARRAY_AXES, TOKEN_AXES


class Pending:
    """A stage not laid out yet: load() returns its array; parts(), when given, its items along the
    first axis as views into the batch, without laying it out."""

    def __init__(self, load: Callable[[], np.ndarray], parts: Callable[[], list[np.ndarray]] | None = None) -> None:
        self.load = load
        self.parts = parts


class Derived(Pending):
    """A stage computed from the record's other stages when first read (scores from q and k).

    It is given the TraceArrays itself on load rather than closing over it: a closure over the record held in the
    record is a reference cycle, which kept a dropped trace's whole batch (4.5 GB of weights at 2,048 SmolLM2
    tokens) alive until Python's cycle collector ran.
    """

    def __init__(self, derive: Callable[[TraceArrays], np.ndarray]) -> None:
        super().__init__(self._unbound)
        self.derive = derive

    @staticmethod
    def _unbound() -> np.ndarray:
        raise RuntimeError("a derived stage is loaded by its TraceArrays")


class TraceArrays(MutableMapping[str, np.ndarray]):
    """Stage name -> numpy array; a stage still in the batch is copied out when first read."""

    def __init__(self, items: dict[str, np.ndarray | Pending] | None = None) -> None:
        self._items: dict[str, np.ndarray | Pending] = dict(items or {})
        self._lock = threading.RLock()  # a cached trace may be read by two server threads at once

    def __getitem__(self, stage: str) -> np.ndarray:
        item = self._items[stage]
        if not isinstance(item, Pending):
            return item
        with self._lock:
            item = self._items[stage]
            if isinstance(item, Derived):
                item = self._items[stage] = item.derive(self)
            elif isinstance(item, Pending):  # not loaded by another thread meanwhile
                item = self._items[stage] = item.load()
            return item

    def __setitem__(self, stage: str, array: np.ndarray) -> None:
        with self._lock:
            self._items[stage] = array

    def __delitem__(self, stage: str) -> None:
        with self._lock:
            del self._items[stage]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, stage: object) -> bool:
        return stage in self._items

    def layer_parts(self, stage: str) -> list[np.ndarray]:
        """stage's array as its items along the first axis (the layers): views into the batch while the
        stage is not laid out (nothing is copied), else views of its array. Read them, never write."""
        item = self._items[stage]
        if isinstance(item, Pending) and item.parts is not None:
            return item.parts()
        return list(self[stage])

    def pending(self) -> list[str]:
        """Stages not laid out yet."""
        return [k for k, v in self._items.items() if isinstance(v, Pending)]

    def __reduce__(self) -> tuple[Any, ...]:  # pickle and copy every stage as a plain array
        return (TraceArrays, ({k: self[k] for k in self},))

    def __repr__(self) -> str:
        return f"TraceArrays({list(self._items)}, pending={self.pending()})"


KEY_SIDE = ("k", "v")  # stages whose token axis runs over the keys (the source's tokens, for cross-attention)


def token_index(stage: str, n_query: int, n_key: int | None = None) -> tuple[slice, ...]:
    """The first tokens on every token axis of a stage's array (its ARRAY_AXES): n_query on the queries' side,
    n_key (default n_query) on the keys' side (the "key" axis, and the token axis of k and v)."""
    def length(axis: str) -> int:
        return n_query if n_key is None or (axis != "key" and stage not in KEY_SIDE) else n_key

    return tuple(slice(0, length(a)) if a in TOKEN_AXES else slice(None) for a in ARRAY_AXES[stage])
