"""Recompute every layer's attention independently, from its captured input and its own weights."""

from __future__ import annotations

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


def layer_mask(n_tokens: int, causal: bool) -> torch.Tensor | None:
    """The additive mask of an unpadded text: the causal mask for decoders, none otherwise."""
    return maths.causal_mask(n_tokens) if causal else None


@torch.no_grad()
def recompute(
    x: torch.Tensor, params: list[maths.AttentionParams], causal: bool
) -> dict[str, torch.Tensor]:
    """x: [layer, token, d_model] captured inputs -> each stage stacked over layers.

    q, k, v, context: [layer, head, token, d_head]; scores, weights: [layer, head, query, key];
    output: [layer, token, d_model].
    """
    mask = layer_mask(int(x.shape[1]), causal)
    per_layer = [maths.multi_head_attention(x[i], p, mask) for i, p in enumerate(params)]
    return {s: torch.stack([st[s] for st in per_layer]) for s in RECOMPUTED_STAGES}
