"""Recompute every layer's attention independently, from its captured input and its own weights."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import nn

from attnscope import maths
from attnscope.capture import attention_modules
from attnscope.families import family_of

RECOMPUTED_STAGES = ("q", "k", "v", "scores", "weights", "context", "output")
CHUNK_BYTES = 4 * 2**20  # a chunk of a few MiB of attention maps stays in the CPU's cache


def layer_params(model: nn.Module) -> list[maths.AttentionParams] | None:
    """Each layer's attention parameters, or None when the family is not supported."""
    fam = family_of(model)
    mods = attention_modules(model)
    if fam is None or not mods:
        return None
    n_layers = int(getattr(model.config, "num_hidden_layers", getattr(model.config, "n_layer", len(mods))))
    if len(mods) == 1 and n_layers > 1:  # ALBERT: one module shared by every layer
        mods = mods * n_layers
    return [fam.params(model, m, layer) for layer, m in enumerate(mods)]


def layer_mask(n_tokens: int, causal: bool, keep: torch.Tensor | None = None) -> torch.Tensor | None:
    """The additive mask: padded keys (keep [batch, key] is 0) and, for decoders, future keys.

    Returns [batch, 1, query, key] with keep, [query, key] without, or None when nothing is hidden.
    """
    pad = None if keep is None or bool(keep.all()) else maths.padding_mask(keep)[:, None]  # [batch, 1, 1, key]
    return maths.combine_masks(pad, maths.causal_mask(n_tokens) if causal else None)


@torch.no_grad()
def recompute_layers(
    x: torch.Tensor | Sequence[torch.Tensor], params: list[maths.AttentionParams], causal: bool,
    keep: torch.Tensor | None = None, chunk_bytes: int | None = None,
) -> Iterator[tuple[int, slice, dict[str, torch.Tensor]]]:
    """The compared stages of each layer from its captured input: yields (layer, rows, stages).

    x: [batch, token, d_model] per layer; keep: [batch, token], 1 for real tokens and 0 for padding.
    chunk_bytes: recompute that many bytes of [rows, head, query, key] at a time (default: all rows
    at once). Only one chunk's intermediates are alive at a time.
    """
    n_rows, n_tokens = int(x[0].shape[0]), int(x[0].shape[1])
    mask = layer_mask(n_tokens, causal, keep)  # [batch, 1, query, key], [query, key] or None
    n_heads = params[0].n_heads if params else 1
    chunks = row_chunks(n_heads * n_tokens * n_tokens, n_rows, chunk_bytes)
    for layer, p in enumerate(params):
        for rows in chunks:
            rows_mask = mask[rows] if mask is not None and mask.dim() == 4 else mask
            yield layer, rows, compared_stages(x[layer][rows], p, rows_mask)


def row_chunks(row_items: int, n_rows: int, chunk_bytes: int | None = CHUNK_BYTES) -> list[slice]:
    """Slices of batch rows holding about chunk_bytes of float32 each (rows of row_items numbers)."""
    step = n_rows if chunk_bytes is None else max(1, chunk_bytes // max(1, 4 * row_items))
    return [slice(i, i + step) for i in range(0, n_rows, step)]


def compared_stages(x: torch.Tensor, p: maths.AttentionParams, mask: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """RECOMPUTED_STAGES of one layer: maths.multi_head_attention's steps and numbers, without keeping
    `scaled` and `masked` (they are formed in one fresh tensor that the softmax then overwrites)."""
    h = p.n_heads
    q = maths.split_heads(maths.project(x, p.w_q, p.b_q), h)  # [..., head, token, d_head]
    k = maths.split_heads(maths.project(x, p.w_k, p.b_k), h)
    v = maths.split_heads(maths.project(x, p.w_v, p.b_v), h)
    scores = maths.dot_scores(q, k)  # [..., head, query, key]
    logits = maths.scale(scores, p.scaling)  # scaled
    if mask is not None:
        logits.add_(mask)  # masked: the same sum as maths.apply_mask, in place
    weights = maths.softmax(logits, in_place=True)
    context = maths.attend(weights, v)  # [..., head, query, d_head]
    output = maths.project(maths.merge_heads(context), p.w_o, p.b_o)  # [..., query, d_model]
    return {"q": q, "k": k, "v": v, "scores": scores, "weights": weights, "context": context, "output": output}
