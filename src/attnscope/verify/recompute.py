"""Recompute every layer's attention independently, from its captured input and its own weights.

The verified path is the taught path: each layer is `maths.multi_head_attention`, asked to keep
only the compared stages and to work in place.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import nn

from attnscope import families, maths

PROJECTED_STAGES = ("q", "k", "v")  # formed for every row of a layer at once
ATTENDED_STAGES = ("scores", "weights", "context", "output")  # formed a few rows at a time
RECOMPUTED_STAGES = PROJECTED_STAGES + ATTENDED_STAGES
CHUNK_BYTES = 4 * 2**20  # a chunk of a few MiB of attention maps stays in the CPU's cache


def layer_params(model: nn.Module, n_positions: int = 1) -> list[maths.AttentionParams] | None:
    """Each layer's attention parameters (rotation for texts of n_positions tokens), or None when the
    family is not supported (`families.why_unsupported` names the step)."""
    return families.layer_params(model, n_positions)


def layer_mask(n_tokens: int, window: maths.Window, keep: torch.Tensor | None = None) -> torch.Tensor | None:
    """The additive mask: padded keys (keep [batch, key] is 0) and the keys outside the layer's window
    (future keys for decoders, a sliding window).

    Returns [batch, 1, query, key] with keep, [query, key] without, or None when nothing is hidden.
    """
    pad = None if keep is None or bool(keep.all()) else maths.padding_mask(keep)[:, None]  # [batch, 1, 1, key]
    return maths.combine_masks(pad, maths.window_mask(n_tokens, window))


@torch.no_grad()
def recompute_layers(
    x: torch.Tensor | Sequence[torch.Tensor], params: list[maths.AttentionParams],
    keep: torch.Tensor | None = None, chunk_bytes: int | None = None, scores: Callable[[int], bool] | None = None,
) -> Iterator[tuple[int, slice, dict[str, torch.Tensor]]]:
    """The compared stages of each layer from its captured input: yields (layer, rows, stages), for each layer
    first q, k and v of every row (the attention reads them next: compare them without writing into them), then
    scores, weights, context and output of each chunk of rows.

    x: [batch, token, d_model] per layer; keep: [batch, token], 1 for real tokens and 0 for padding.
    chunk_bytes: recompute that many bytes of [rows, head, query, key] at a time (default: all rows
    at once). Only one chunk's intermediates are alive at a time: the scores and weights of a chunk are
    written into the same buffers as the previous chunk's, so compare them before asking for the next.
    scores(layer), asked once that layer's q, k and v were yielded: whether its chunks form the scores (default:
    always). A check that found q and k equal to the capture needs none: they are q k^T of the same numbers.
    """
    n_rows, n_tokens = int(x[0].shape[0]), int(x[0].shape[1])
    masks: dict[maths.Window, torch.Tensor | None] = {}  # one mask per distinct window
    scratch: dict[str, torch.Tensor] = {}  # the big [rows, head, query, key] tensors, reused chunk after chunk
    n_heads = params[0].n_heads if params else 1
    chunks = row_chunks(n_heads * n_tokens * n_tokens, n_rows, chunk_bytes)
    for layer, p in enumerate(params):
        if p.window not in masks:
            masks[p.window] = layer_mask(n_tokens, p.window, keep)  # [batch, 1, query, key], [query, key] or None
        wants = functools.partial(scores, layer) if scores is not None else None
        for rows, _block, stages in recompute_layer(x[layer], p, masks[p.window], chunks, scratch, wants):
            yield layer, rows, stages


def recompute_layer(
    x: torch.Tensor, p: maths.AttentionParams, mask: torch.Tensor | None, chunks: Sequence[slice],
    scratch: dict[str, torch.Tensor], scores: Callable[[], bool] | None = None,
    blocks: Sequence[tuple[int, int]] | None = None,
) -> Iterator[tuple[slice, tuple[int, int] | None, dict[str, torch.Tensor]]]:
    """One layer of recompute_layers: yields (rows, block, stages), first q, k and v of every row (block None),
    then the attended stages of each chunk of rows. x: [batch, token, d_model]; mask: layer_mask's for this layer's
    window; scratch: buffers reused from chunk to chunk (and layer to layer, when the caller keeps it); scores(),
    asked once q, k and v were yielded: whether the chunks form the scores (default: always).

    blocks (a causal layer, `query_blocks`), when no scores are formed: each chunk's attention a block of queries
    (a, b) at a time, over the keys they see, 0..b: stages [rows, head, b - a, b] (weights) and [rows, head, b - a,
    d_head] (context), the weights past key b being the softmax's exact 0 for the mask's minimum. Each key row is
    the same dot products, the same softmax and, for blocks ending on multiples of QUERY_BLOCK keys, the same
    weights @ v as the whole layer's (tests/verify/test_check_blocks.py compares them); 5/8 of the work at 2,048
    tokens."""
    n_rows = int(x.shape[0])
    # q, k, v of every row at once (one product per projection); only [query, key] work goes in chunks
    projected = maths.project_qkv(x, p)  # [batch, head|kv_head, token, d_head]
    yield slice(0, n_rows), None, {name: projected[name] for name in PROJECTED_STAGES}
    formed = scores is None or scores()
    attended = ATTENDED_STAGES if formed else ATTENDED_STAGES[1:]
    for rows in chunks:
        rows_mask = mask[rows] if mask is not None and mask.dim() == 4 else mask
        if blocks is None or formed or rows_mask is None or rows_mask.dim() != 2:
            yield rows, None, maths.multi_head_attention(
                x[rows], p, rows_mask, keep=attended, in_place=True, scratch=scratch,
                projected={name: projected[name][rows] for name in PROJECTED_STAGES})
            continue
        for a, b in blocks:  # queries a..b see keys 0..b
            yield rows, (a, b), maths.multi_head_attention(
                x[rows, a:b], p, rows_mask[a:b, :b], keep=attended, in_place=True, scratch=scratch,
                projected={"q": projected["q"][rows, :, a:b], "k": projected["k"][rows, :, :b],
                           "v": projected["v"][rows, :, :b]})


QUERY_BLOCK = 512  # keys: a causal layer's check attends blocks of queries ending on multiples of this


def query_blocks(p: maths.AttentionParams, n_tokens: int) -> list[tuple[int, int]] | None:
    """The query blocks (a, b) a causal layer's check attends one at a time, or None where the layer goes whole:
    a plain causal mask (no window before, none after), no sink and no relative bias, at least 2 x QUERY_BLOCK
    tokens (SmolLM2's check, CPU s: at 600 tokens 1.57 in blocks against 1.35 whole; at 1,100 3.42 against 3.83;
    at 2,048 9.2 against 12.1)."""
    if p.window != maths.Window(None, 0) or p.sinks is not None or p.relative_bias is not None \
            or n_tokens < 2 * QUERY_BLOCK:
        return None
    ends = [*range(QUERY_BLOCK, n_tokens, QUERY_BLOCK), n_tokens]
    return list(zip([0, *ends[:-1]], ends, strict=True))


def row_chunks(row_items: int, n_rows: int, chunk_bytes: int | None = CHUNK_BYTES) -> list[slice]:
    """Slices of batch rows holding about chunk_bytes of float32 each (rows of row_items numbers)."""
    step = n_rows if chunk_bytes is None else max(1, chunk_bytes // max(1, 4 * row_items))
    return [slice(i, i + step) for i in range(0, n_rows, step)]
