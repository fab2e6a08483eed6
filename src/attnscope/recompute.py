"""Recompute every layer's attention independently, from its captured input and its own weights."""

from __future__ import annotations

from collections.abc import Iterator

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
    x: torch.Tensor, params: list[maths.AttentionParams], causal: bool, keep: torch.Tensor | None = None
) -> Iterator[dict[str, torch.Tensor]]:
    """x: [layer, (batch,) token, d_model] captured inputs -> every stage of each layer, one layer at a time.

    keep: [batch, token], 1 for real tokens and 0 for padding. Yielding per layer keeps only one
    layer's intermediates alive (see attnscope.maths.multi_head_attention for their axes).
    """
    mask = layer_mask(int(x.shape[-2]), causal, keep)
    for i, p in enumerate(params):
        yield maths.multi_head_attention(x[i], p, mask)
