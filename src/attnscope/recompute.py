"""Recompute every layer's attention independently, from its captured input and its own weights."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import nn

from attnscope import maths
from attnscope.capture import attention_modules
from attnscope.families import family_of

RECOMPUTED_STAGES = ("q", "k", "v", "scores", "weights", "context", "output")


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
    keep: torch.Tensor | None = None,
) -> Iterator[dict[str, torch.Tensor]]:
    """x: the captured inputs, [(batch,) token, d_model] per layer -> every stage of each layer, one at a time.

    keep: [batch, token], 1 for real tokens and 0 for padding. Yielding per layer keeps only one
    layer's intermediates alive (see attnscope.maths.multi_head_attention for their axes).
    """
    mask = layer_mask(int(x[0].shape[-2]), causal, keep)
    for i, p in enumerate(params):
        yield compared_stages(x[i], p, mask)


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
