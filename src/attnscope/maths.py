"""Scaled dot-product attention from scratch, as pure functions of tensors.

Every function takes and returns plain tensors; nothing here knows about models.
Stage names follow the project vocabulary (attnscope.stages): x, q, k, v, scores, scaled,
masked, weights, context, merged, output.

Why divide by sqrt(d_head)? If the entries of q and k are independent with mean 0
and variance 1, their dot product over d_head terms has variance d_head. Dividing by
sqrt(d_head) brings the scores back to unit variance, so the softmax does not
saturate into a near one-hot distribution with vanishing gradients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionParams:
    """One attention layer's parameters in the x @ W convention: W is [d_model, n_head * d_head]."""

    w_q: torch.Tensor  # [d_model, head * d_head]
    b_q: torch.Tensor | None  # [head * d_head]
    w_k: torch.Tensor
    b_k: torch.Tensor | None
    w_v: torch.Tensor
    b_v: torch.Tensor | None
    w_o: torch.Tensor  # [head * d_head, d_model]
    b_o: torch.Tensor | None  # [d_model]
    n_heads: int
    scaling: float  # usually 1 / sqrt(d_head)

    @property
    def d_head(self) -> int:
        return int(self.w_q.shape[1]) // self.n_heads


def project(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x @ W + b.  [..., token, d_in] x [d_in, d_out] -> [..., token, d_out]"""
    y = x @ w
    return y if b is None else y.add_(b)  # in place on the fresh product: same sum


def split_heads(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[..., token, head * d_head] -> [..., head, token, d_head]"""
    *lead, n_tok, width = t.shape
    return t.reshape(*lead, n_tok, n_heads, width // n_heads).transpose(-3, -2)


def merge_heads(t: torch.Tensor) -> torch.Tensor:
    """[..., head, token, d_head] -> [..., token, head * d_head]"""
    *lead, n_heads, n_tok, d_head = t.shape
    return t.transpose(-3, -2).reshape(*lead, n_tok, n_heads * d_head)


def dot_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q k^T.  [..., query, d_head] x [..., d_head, key] -> [..., query, key]"""
    return q @ k.transpose(-1, -2)


def scale(scores: torch.Tensor, scaling: float) -> torch.Tensor:
    """Multiply by the scaling factor (1 / sqrt(d_head) in the standard case)."""
    return scores * scaling


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


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Sum additive masks, clamping at the dtype's minimum so two masked entries stay finite."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    total = present[0]
    for m in present[1:]:
        total = total + m
    return total.clamp(min=torch.finfo(total.dtype).min)


def apply_mask(scaled: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Add the additive mask: [..., query, key] + [..., query|1, key]."""
    return scaled if mask is None else scaled + mask


def softmax(masked: torch.Tensor, in_place: bool = False) -> torch.Tensor:
    """Softmax over keys: exp(s - max) / sum exp(s - max), each row sums to 1.

    in_place=True overwrites `masked` (for a caller that owns it and needs it no longer); same numbers.
    """
    row_max = masked.amax(dim=-1, keepdim=True)
    e = (masked.sub_(row_max) if in_place else masked - row_max).exp_()
    return e.div_(e.sum(dim=-1, keepdim=True))


def attend(weights: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """weights v.  [..., query, key] x [..., key, d_head] -> [..., query, d_head]"""
    return weights @ v


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
    scaling: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Annotated Transformer's attention(): returns (context, weights).

    q, k, v: [..., token, d_head]; mask: additive, broadcastable to [..., query, key].
    """
    s = 1.0 / math.sqrt(q.shape[-1]) if scaling is None else scaling
    weights = softmax(apply_mask(scale(dot_scores(q, k), s), mask))
    return attend(weights, v), weights


def multi_head_attention(
    x: torch.Tensor, params: AttentionParams, mask: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """Every stage of one multi-head self-attention layer, by name.

    x: [..., token, d_model]; mask: additive, broadcastable to [..., head, query, key].
    Returns x, q, k, v [..., head, token, d_head]; scores, scaled, masked, weights
    [..., head, query, key]; context [..., head, token, d_head]; merged
    [..., token, head * d_head]; output [..., token, d_model].
    """
    h = params.n_heads
    q = split_heads(project(x, params.w_q, params.b_q), h)  # [..., head, token, d_head]
    k = split_heads(project(x, params.w_k, params.b_k), h)
    v = split_heads(project(x, params.w_v, params.b_v), h)
    scores = dot_scores(q, k)  # [..., head, query, key]
    scaled = scale(scores, params.scaling)
    masked = apply_mask(scaled, mask)
    weights = softmax(masked)
    context = attend(weights, v)  # [..., head, query, d_head]
    merged = merge_heads(context)  # [..., query, head * d_head]
    output = project(merged, params.w_o, params.b_o)  # [..., query, d_model]
    return {
        "x": x, "q": q, "k": k, "v": v, "scores": scores, "scaled": scaled, "masked": masked,
        "weights": weights, "context": context, "merged": merged, "output": output,
    }
