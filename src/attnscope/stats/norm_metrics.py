"""Norm-weighted category averages (Kobayashi et al. 2020) for the corpus statistics.

Clark et al.'s category averages ask how much attention *weight* goes to [CLS], [SEP],
punctuation and the other tokens. Kobayashi et al. ask the same of the vectors each weight
moves: the share of a row's norm-based attention ||alpha_ij f(x_j)|| (`norm_head`, see
attnscope.norms) that lands on each category,

    share_ij = N_ij / sum_j N_ij,      metric = (1/n) sum_i sum_{j of the category} share_ij

so the numbers compare directly with the weight-based ones (rows of both sum to 1). The
metrics read the source "norm_head": maps [batch, head, query, key] that `norm_maps` computes
per layer from what the attention function saw (v and the weights) and the layer's W_O;
`norm_input` is that computation as a corpus-run input. A run computes them when its settings
name the metric set "norms" (attnscope.stats.metric_sets.NORMS; `attnscope stats --norms`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from attnscope import maths
from attnscope.errors import AttnscopeError
from attnscope.families import base_of, family_of, why_unsupported
from attnscope.stats.metrics import Metric, MetricFn, Units, Values, attention_to, clean

if TYPE_CHECKING:
    from attnscope.stats.metric_sets import LayerView

NORM_SOURCE = "norm_head"
OTHER_EXCLUDES = ("cls", "sep", "punct", "sink")


def norm_maps(v: torch.Tensor, weights: torch.Tensor, w_o: torch.Tensor) -> torch.Tensor:
    """||alpha^h_ij f^h(x_j)|| for one layer of a batch, in float64.

    v [batch, head, key, d_head] (b_V included), weights [batch, head, query, key],
    w_o [head * d_head, d_model] (x @ W convention, b_O excluded) -> [batch, head, query, key].
    """
    n_heads, d_head = v.shape[1], v.shape[-1]
    if w_o.ndim != 2 or w_o.shape[0] != n_heads * d_head:
        raise AttnscopeError(f"W_O must be [head * d_head, d_model] = [{n_heads * d_head}, d_model], "
                             f"got {list(w_o.shape)}")
    w_heads = w_o.to(torch.float64).reshape(n_heads, d_head, -1)  # [head, d_head, d_model]
    f = torch.einsum("bhkd,hdm->bhkm", v.to(torch.float64), w_heads)  # f^h(x_j): [batch, head, key, d_model]
    norms: torch.Tensor = weights.to(torch.float64) * torch.linalg.vector_norm(f, dim=-1)[:, :, None, :]
    return norms


def norm_input(view: LayerView) -> torch.Tensor:
    """The corpus run's "norm_head" input: norm_maps of one layer's attention call, [batch, head, query, key]."""
    fam = family_of(view.model.model)
    if fam is None:
        raise AttnscopeError(f"norm-weighted metrics need each layer's W_O, which attnscope cannot read for "
                             f"{view.model.architecture}: {why_unsupported(view.model.model)}")
    w_o = fam.params(base_of(view.model.model), view.call.module, view.layer).w_o  # [head * d_head, d_model]
    weights = view.call.weights.detach()  # [batch, head, query, key]
    v = view.call.v.detach()  # [batch, kv_head, key, d_head]: grouped-query models share a k/v head
    return norm_maps(maths.expand_kv(v, weights.shape[1] // v.shape[1]), weights, w_o)


def shares(maps: torch.Tensor, units: Units) -> torch.Tensor:
    """Each row divided by its sum over real keys: [batch, head, query, key], rows sum to 1."""
    kept = clean(maps, units)
    return kept / kept.sum(-1, keepdim=True)  # a real row with no norm at all stays NaN: never hidden


def other_kinds(units: Units) -> torch.Tensor:
    """[batch, unit] bool: real units of no named kind."""
    named = torch.zeros_like(units.valid)
    for kind in OTHER_EXCLUDES:
        if kind in units.kinds:
            named = named | units.kinds[kind]
    return units.valid & ~named


def share_to(kind: str) -> MetricFn:
    """(1/n) sum_i sum_{j of this kind} share_ij; kind "other" means none of OTHER_EXCLUDES."""
    def fn(maps: torch.Tensor, units: Units) -> Values:
        if kind != "other":
            return attention_to(kind)(shares(maps, units), units)
        with_other = Units(units.valid, units.rows, {**units.kinds, "other": other_kinds(units)}, units.causal)
        return attention_to("other")(shares(maps, with_other), with_other)

    return fn


NORM_METRICS: tuple[Metric, ...] = (
    Metric("norm_cls", share_to("cls"), "share of norm-based attention to [CLS]", NORM_SOURCE, "bidirectional"),
    Metric("norm_sep", share_to("sep"), "share of norm-based attention to [SEP]", NORM_SOURCE, "bidirectional"),
    Metric("norm_sink", share_to("sink"), "share of norm-based attention to the first token (the sink)",
           NORM_SOURCE, "causal"),
    Metric("norm_punct", share_to("punct"), 'share of norm-based attention to "." and ","', NORM_SOURCE),
    Metric("norm_other", share_to("other"), "share of norm-based attention to all other tokens", NORM_SOURCE),
)
# The weight-based "other" category, for comparison with norm_other (the built-in metrics have cls, sep, sink, punct).
OTHER_METRIC = Metric("other", share_to("other"), "attention to all other tokens")

