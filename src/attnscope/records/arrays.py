"""A trace's arrays: one text's stages laid out [layer, ...], cut from the padded batch on first use.

A forward pass leaves each stage as one [batch, ...] tensor per layer. `TraceArrays` keeps
those tensors and copies a text's rows into a contiguous numpy array [layer, ...] (padding
cut off, axes in ARRAY_AXES) the first time the stage is read. Checking a trace needs none
of these copies, so `attnscope check` never pays for them; a view or a saved file pays once.
Once every stage is read, the trace holds only its own arrays, not the batch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, MutableMapping
from functools import partial
from typing import Any

import numpy as np
import torch

from attnscope.stages import ARRAY_AXES, TOKEN_AXES


class Pending:
    """A stage not laid out yet: load() returns its array; parts(), when given, its items along the
    first axis as views into the batch, without laying it out."""

    def __init__(self, load: Callable[[], np.ndarray], parts: Callable[[], list[np.ndarray]] | None = None) -> None:
        self.load = load
        self.parts = parts


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
            if isinstance(item, Pending):  # not loaded by another thread meanwhile
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


def row_arrays(layers: dict[str, list[torch.Tensor]], row: int, n_tokens: int) -> TraceArrays:
    """One text of a padded batch. layers maps stage -> per-layer [batch, ...] tensors; scores, when
    absent, are q k^T of the text's own q and k."""
    arrays = TraceArrays({stage: Pending(_cut(ts, stage, row, n_tokens), _parts(ts, stage, row, n_tokens))
                          for stage, ts in layers.items()})
    if "scores" not in layers and "q" in layers and "k" in layers:
        arrays._items["scores"] = Pending(partial(_scores, arrays))
    return arrays


def _scores(arrays: TraceArrays) -> np.ndarray:
    """q k^T: [layer, head, query, d_head] x [layer, head, d_head, key] -> [layer, head, query, key]
    (k [layer, kv_head, key, d_head] repeated for the query heads that share each k/v head)."""
    q, k = torch.from_numpy(arrays["q"]), torch.from_numpy(arrays["k"])
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1) if k.shape[1] != q.shape[1] else k
    out = np.empty((*q.shape[:-1], k.shape[-2]), dtype=arrays["q"].dtype)
    torch.matmul(q, k.transpose(-1, -2), out=torch.from_numpy(out))
    return out


def _index(stage: str, row: int, n_tokens: int) -> tuple[int | slice, ...]:
    """One text's part of a layer's [batch, ...] tensor: its row, its first n_tokens on every token axis."""
    return (row, *(slice(0, n_tokens) if a in TOKEN_AXES else slice(None) for a in ARRAY_AXES[stage][1:]))


def _parts(layers: list[torch.Tensor], stage: str, row: int, n_tokens: int) -> Callable[[], list[np.ndarray]]:
    """Views of one stage of one text, one per layer (nothing copied)."""
    index = _index(stage, row, n_tokens)
    return lambda: [t[index].numpy() for t in layers]


def _cut(layers: list[torch.Tensor], stage: str, row: int, n_tokens: int) -> Callable[[], np.ndarray]:
    """A loader of one stage of one text: [layer, ...] with its first n_tokens on every token axis."""
    index = _index(stage, row, n_tokens)

    def load() -> np.ndarray:
        first = layers[0][index]
        # numpy allocates big arrays on transparent huge pages where Linux offers them, which makes
        # this copy several times faster than into a fresh torch tensor (page faults dominate)
        out = np.empty((len(layers), *first.shape), dtype=first.numpy().dtype)
        dst = torch.from_numpy(out)
        for i, t in enumerate(layers):
            dst[i].copy_(t[index])
        return out

    return load
