"""Which keys a query may see, as additive masks (0: seen; the dtype's minimum: hidden), and T5's learned
relative position bias: the mask and bias steps of the from-scratch maths (attnscope.maths re-exports them).

Shapes: masks are [query, key] (or [..., 1, key] from a keep-vector, broadcast over queries); T5's bias is
[head, query, key].
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from attnscope.maths import RelativeBias, Window


def relative_position_bucket(relative: torch.Tensor, bidirectional: bool, n_buckets: int,
                             max_distance: int) -> torch.Tensor:
    """T5's bucket of each key - query distance (Raffel et al. 2020, after Mesh TensorFlow): one bucket per
    distance below half the buckets, then logarithmically wider ones up to max_distance.

    relative: key - query, integers [query, key] -> bucket [query, key]. bidirectional (the encoder): keys
    after the query use the upper half of the buckets; otherwise (the decoder) future keys share bucket 0.
    """
    bucket = torch.zeros_like(relative)
    if bidirectional:
        n_buckets //= 2
        bucket = bucket + (relative > 0).long() * n_buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    exact = n_buckets // 2
    # log(0) is -inf where distance is 0: those entries take the exact branch below
    log_ratio = torch.log(distance.float() / exact) / math.log(max_distance / exact)
    wide = (exact + (log_ratio * (n_buckets - exact)).long()).clamp(max=n_buckets - 1)
    return bucket + torch.where(distance < exact, distance, wide)


def relative_position_bias(n_query: int, n_key: int, bias: RelativeBias) -> torch.Tensor:
    """T5's learned bias of each query-key pair's distance bucket: [head, query, key]."""
    relative = torch.arange(n_key)[None, :] - torch.arange(n_query)[:, None]  # [query, key]: key - query
    buckets = relative_position_bucket(relative, bias.bidirectional, int(bias.table.shape[0]), bias.max_distance)
    return bias.table[buckets].permute(2, 0, 1)  # [query, key, head] -> [head, query, key]


def padding_mask(keep: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive mask from a keep-vector: 0 where kept, the dtype's minimum where padded.

    [..., key] (bool or 0/1) -> [..., 1, key]; broadcasts over queries.
    """
    neg = torch.finfo(dtype).min
    zero = torch.zeros((), dtype=dtype)
    return torch.where(keep.bool(), zero, torch.tensor(neg, dtype=dtype)).unsqueeze(-2)


def causal_mask(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive mask that hides future keys: [query, key], 0 on and below the diagonal."""
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    return torch.zeros(n, n, dtype=dtype).masked_fill(future, torch.finfo(dtype).min)


def window_mask(n: int, window: Window, dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """Additive mask hiding the keys outside the window: [query, key], or None when every key is seen."""
    if window.before is None and window.after is None:
        return None
    offset = torch.arange(n)[:, None] - torch.arange(n)[None, :]  # [query, key]: i - j
    hidden = torch.zeros(n, n, dtype=torch.bool)
    if window.before is not None:
        hidden |= offset > window.before
    if window.after is not None:
        hidden |= -offset > window.after
    return torch.zeros(n, n, dtype=dtype).masked_fill(hidden, torch.finfo(dtype).min)


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Sum additive masks, clamping at the dtype's minimum so two masked entries stay finite."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    total = present[0]
    for m in present[1:]:
        total = total + m
    return total.clamp(min=torch.finfo(total.dtype).min)
