"""Attention knockout (Geva et al. 2023): block the edges along which token J reads token I (the query J's
weight on the key I) by adding -inf to that entry of the additive mask before the softmax, in chosen layers.

Edges run as information flows: "from I to J" is what token I passes to token J. One batched forward
holds the untouched row, the knockout in all chosen layers, and the knockout in each chosen layer alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from attnscope.errors import AttnscopeError, require_text, validate_index
from attnscope.families import is_causal
from attnscope.interventions.effects import PRIMARY, Kind, effects, outputs, prepare
from attnscope.interventions.gates import HeadEdit
from attnscope.models import Model, ModelLike, load_model
from attnscope.tokens import Token

Edge = tuple[int, int]  # (from token I: the key, to token J: the query), 0-indexed


@dataclass
class Knockout:
    """The effect of blocking edges, in the chosen layers together and in each alone (0-indexed)."""

    model: str
    kind: Kind
    tokens: list[Token]
    target: str | None
    edges: list[Edge]
    layers: list[int]
    clean: dict[str, float]
    knocked: dict[str, float]  # all chosen layers: measures and changes (d_...)
    per_layer: dict[str, list[float]]  # each chosen layer alone, in the order of `layers`

    @property
    def primary(self) -> str:
        return PRIMARY[self.kind]

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "kind": self.kind, "target": self.target,
                "tokens": [t.text for t in self.tokens], "edges": [list(e) for e in self.edges],
                "layers": self.layers, "clean": self.clean, "knocked": self.knocked,
                "per_layer": self.per_layer, "primary": self.primary}


def knockout(text: str, from_tokens: Sequence[int], to_tokens: Sequence[int], layers: Sequence[int] | None = None,
             model: ModelLike = None, target: str | None = None, max_length: int = 256) -> Knockout:
    """Block every edge from a token of from_tokens to a token of to_tokens in `layers` (default: all)."""
    m = load_model(model)
    require_text(text)
    probe = prepare(m, text, target, max_length)
    n_text = len(probe.tokens) - len(probe.target_ids) if probe.kind == "causal-lm" else len(probe.tokens)
    edges = validate_edges(m, [(i, j) for i in from_tokens for j in to_tokens], n_text, probe.n_tokens)
    chosen = validate_layers(m, layers)
    rows = 2 + len(chosen)
    knock: list[torch.Tensor | None] = [None] * m.n_layers
    for layer in chosen:
        t = torch.zeros(rows, 1, probe.n_tokens, probe.n_tokens)  # [row, 1, query, key]
        for i, j in edges:
            t[1, 0, j, i] = float("-inf")
            t[2 + chosen.index(layer), 0, j, i] = float("-inf")
        knock[layer] = t
    with torch.no_grad():
        fx = effects(probe.kind, outputs(probe, probe.rows(rows), HeadEdit(m.n_layers, knock=knock)))
    scalars = {k: v for k, v in fx.items() if v.ndim == 1}
    clean = {k: float(v[0]) for k, v in scalars.items() if k in ("target_logprob", "loss")}
    return Knockout(m.name, probe.kind, probe.tokens, probe.target, edges, chosen, clean,
                    {k: float(v[1]) for k, v in scalars.items()},
                    {k: [float(x) for x in v[2:]] for k, v in scalars.items()})


def validate_edges(m: Model, edges: list[Edge], n_text: int, n_tokens: int) -> list[Edge]:
    """Tokens in range, edges a causal model has, and no query left without a key to read."""
    if not edges:
        raise AttnscopeError("no edges given: name from and to tokens (0-indexed)")
    causal = is_causal(m.model)
    for i, j in edges:
        validate_index("token", i, n_text, "the text")
        validate_index("token", j, n_text, "the text")
        if causal and i > j:
            raise AttnscopeError(f"token {j} cannot read the later token {i} in a causal model: "
                                 "there is no edge to block, give from <= to")
    for j in {j for _, j in edges}:
        visible = j + 1 if causal else n_tokens
        if sum(1 for _, q in edges if q == j) >= visible:
            raise AttnscopeError(f"blocking these edges leaves token {j} nothing to attend to: keep at least one key")
    return sorted(set(edges))


def validate_layers(m: Model, layers: Sequence[int] | None) -> list[int]:
    if layers is None:
        return list(range(m.n_layers))
    if not layers:
        raise AttnscopeError("no layers given: name at least one layer (0-indexed) or leave layers out for all")
    for layer in layers:
        validate_index("layer", layer, m.n_layers, m.name)
    return sorted(set(int(x) for x in layers))
