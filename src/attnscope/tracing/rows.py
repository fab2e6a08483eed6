"""One text's rows of a padded batch, as the TraceArrays of its Trace: each stage cut on first read.

A forward pass leaves each stage as one [batch, ...] tensor per layer. A text's part is its row and its first
tokens on every token axis (records.arrays.token_index): the same cut for self-attention and for
cross-attention, whose queries run over the target and whose keys over the source. Scores, when not captured,
are q k^T of the text's own q and k (maths.expand_kv gives each query head its k/v head).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from attnscope import maths
from attnscope.records.arrays import Derived, Pending, TraceArrays, token_index


def row_arrays(layers: dict[str, list[torch.Tensor]], row: int, n_query: int, n_key: int | None = None,
               more: dict[str, Pending] | None = None) -> TraceArrays:
    """One text of a padded batch. layers maps stage -> per-layer [batch, ...] tensors; n_key: the keys'
    length where it differs from the queries' (cross-attention); more: further stages, already cut."""
    items: dict[str, np.ndarray | Pending] = dict(more or {})
    for stage, ts in layers.items():
        index: tuple[int | slice, ...] = (row, *token_index(stage, n_query, n_key)[1:])  # batch axis for layer axis
        items[stage] = Pending(_cut(ts, index), _parts(ts, index))
    if "scores" not in layers and "q" in layers and "k" in layers:
        items["scores"] = Derived(scores)  # q k^T of the record's own q and k, when first read
    return TraceArrays(items)


def scores(arrays: TraceArrays | dict[str, np.ndarray]) -> np.ndarray:
    """q k^T: [layer, head, query, d_head] x [layer, kv_head, key, d_head] -> [layer, head, query, key]."""
    q, k = torch.from_numpy(arrays["q"]), torch.from_numpy(arrays["k"])
    k = maths.expand_kv(k, int(q.shape[1]) // int(k.shape[1]))  # the k/v head each query head reads
    out = np.empty((*q.shape[:-1], k.shape[-2]), dtype=arrays["q"].dtype)
    maths.dot_scores(q, k, out=torch.from_numpy(out))
    return out


def _parts(layers: list[torch.Tensor], index: tuple[int | slice, ...]) -> Callable[[], list[np.ndarray]]:
    """Views of one stage of one text, one per layer (nothing copied)."""
    return lambda: [t[index].numpy() for t in layers]


def _cut(layers: list[torch.Tensor], index: tuple[int | slice, ...]) -> Callable[[], np.ndarray]:
    """A loader of one stage of one text: [layer, ...] cut by index."""
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
