"""Head ablation: the effect on the output of removing heads (zero or mean), together or each alone.

All settings run as rows of one batched forward pass: row 0 is the untouched model, row 1 the chosen
heads removed together, and with each=True one more row per head of the model (a layer x head grid).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from attnscope.errors import AttnscopeError, require_text
from attnscope.families import is_encoder_decoder
from attnscope.interventions.effects import PRIMARY, Kind, Probe, effects, outputs, prepare
from attnscope.interventions.gates import Head, HeadEdit, mean_contexts, n_layers_heads, ones, validate_heads
from attnscope.interventions.seq2seq import (
    AnyHead,
    kind_edit,
    kind_gates,
    kind_means,
    layout,
    seq2seq_inputs,
    seq2seq_measures,
    validate_attention,
    validate_kind_heads,
)
from attnscope.models import Model, ModelLike, load_model
from attnscope.tokens import Token, encode

Mode = Literal["zero", "mean"]
MODES = ("zero", "mean")


@dataclass
class Ablation:
    """What removing heads did to the output. Layers and heads are 0-indexed."""

    model: str
    kind: Kind
    tokens: list[Token]
    target: str | None
    mode: Mode
    heads: list[AnyHead]  # removed together (may be empty with each=True); encoder-decoders: (kind, layer, head)
    clean: dict[str, float]  # the untouched model's measures
    ablated: dict[str, float] | None  # with `heads` removed: measures and changes (d_...)
    token_change: list[float] | None  # encoders: each token's relative final-state change
    grid: dict[str, np.ndarray] | None  # each=True: every measure with one head removed, [layer, head]
    attention: str | None = None  # encoder-decoders: the kind of attention the grid removes heads of

    @property
    def primary(self) -> str:
        """The measure the grid's heatmap shows."""
        return PRIMARY[self.kind]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "kind": self.kind, "mode": self.mode, "target": self.target,
            "tokens": [t.text for t in self.tokens], "heads": [list(h) for h in self.heads],
            "clean": self.clean, "ablated": self.ablated, "token_change": self.token_change,
            "primary": self.primary, "attention": self.attention,
            "grid": None if self.grid is None else {k: v.tolist() for k, v in self.grid.items()},
        }


def ablate(text: str, heads: Sequence[AnyHead] = (), model: ModelLike = None, mode: Mode = "zero",
           target: str | None = None, each: bool = False, reference: Sequence[str] | None = None,
           max_length: int = 256, attention: str | None = None) -> Ablation:
    """Remove heads (zero: their context set to 0; mean: to its mean over the reference texts, default the
    text itself) and measure the output. each=True also removes every head alone, in the same forward.
    Encoder-decoders: text is the source, target= the teacher-forced target, heads are (kind, layer, head) with
    kind "encoder", "decoder" or "cross", and each=True needs attention= (the kind whose heads the grid removes)."""
    m = load_model(model)
    require_text(text)
    if mode not in MODES:
        raise AttnscopeError(f"mode {mode!r} is unknown: use one of {', '.join(MODES)}")
    if not heads and not each:
        raise AttnscopeError("no heads given: name heads (layer.head pairs, 0-indexed), or ablate each head in "
                             "turn (each)", parameter="heads")
    if is_encoder_decoder(m.model):
        if attention is not None and not each:
            raise AttnscopeError("attention= picks the kind of attention of the each=True grid: add each=True")
        grid = validate_attention(attention) if each else None
        return _ablate_seq2seq(m, text, heads, mode, target, grid, reference, max_length)
    if attention is not None:
        raise AttnscopeError(f"attention= names a kind of an encoder-decoder's attention; {m.name} has one kind: "
                             "leave it out")
    if any(len(h) != 2 for h in heads):
        raise AttnscopeError(f"{m.name} has one kind of attention: write heads as (layer, head), without a kind")
    chosen = validate_heads(m, heads) if heads else []  # type: ignore[arg-type]
    probe = prepare(m, text, target, max_length)
    source = _source(m, probe, mode, reference, max_length)
    scale = setting_gates(m, [chosen] if chosen else [], each)
    edit = HeadEdit(m.n_layers, scale, source)
    with torch.no_grad():
        fx = effects(probe.kind, outputs(probe, probe.rows(int(scale.shape[1])), edit))
    return ablation_result(m, probe, mode, chosen, fx, each)


def setting_gates(m: Model, sets: list[list[Head]], each: bool) -> torch.Tensor:
    """Gates [layer, row, head]: row 0 open, then one row per head set closed, then (each) one row per head."""
    n_layers, n_heads = n_layers_heads(m)
    n_rows = 1 + len(sets) + (n_layers * n_heads if each else 0)
    scale = ones(m, n_rows)
    for row, heads in enumerate(sets, start=1):
        for layer, head in heads:
            scale[layer, row, head] = 0.0
    if each:
        first = 1 + len(sets)
        grid = torch.arange(n_layers * n_heads)
        scale[grid // n_heads, first + grid, grid % n_heads] = 0.0
    return scale


def _source(m: Model, probe: Probe, mode: Mode, reference: Sequence[str] | None,
            max_length: int) -> list[torch.Tensor | None] | None:
    if mode == "zero":
        if reference is not None:
            raise AttnscopeError("reference= is read only with mode='mean': leave it out or use mode='mean'")
        return None
    if reference is None:
        return mean_contexts(m, probe.inputs)
    texts = [require_text(t, "reference text") for t in reference]
    if not texts:
        raise AttnscopeError("the reference set is empty: give at least one text to average over")
    return mean_contexts(m, encode(m.tokenizer, texts, max_length=max_length).inputs)


def ablation_result(m: Model, probe: Probe, mode: Mode, chosen: list[Head], fx: dict[str, np.ndarray],
                    each: bool) -> Ablation:
    """The Ablation of measured effects fx (each measure's rows: clean, then the chosen set's when chosen, then
    every head alone when each): the library's one assembly of a result, also the web app's batched grid's."""
    scalars = {k: v for k, v in fx.items() if v.ndim == 1}
    clean = {k: float(v[0]) for k, v in scalars.items() if not k.startswith("d_") and k != "embedding_distance"
             and k != "mean_token_change"}
    ablated = {k: float(v[1]) for k, v in scalars.items()} if chosen else None
    token_change = [float(x) for x in fx["token_change"][1]] if chosen and "token_change" in fx else None
    grid = None
    if each:
        n_layers, n_heads = n_layers_heads(m)
        first = 2 if chosen else 1
        grid = {k: v[first:].reshape(n_layers, n_heads) for k, v in scalars.items()}
    return Ablation(m.name, probe.kind, probe.tokens, probe.target, mode, list[AnyHead](chosen), clean, ablated,
                    token_change, grid)


def _ablate_seq2seq(m: Model, text: str, heads: Sequence[AnyHead], mode: Mode, target: str | None,
                    grid: str | None, reference: Sequence[str] | None, max_length: int) -> Ablation:
    """Ablate an encoder-decoder's heads by kind, measured on the teacher-forced target (mean: over the source and
    target themselves)."""
    if reference is not None:
        raise AttnscopeError("reference= is not read on an encoder-decoder yet: mode='mean' averages over the source "
                             "and target themselves, leave reference out")
    chosen = validate_kind_heads(m, heads) if heads else []
    inputs, tokens, labels = seq2seq_inputs(m, text, target, max_length)
    scale = kind_gates(m, chosen, grid)
    n_rows = int(next(iter(scale.values())).shape[1])
    rows = {k: v.expand(n_rows, -1).contiguous() for k, v in inputs.items()}
    with torch.no_grad():
        sources = kind_means(m, inputs) if mode == "mean" else None
        fx = effects("seq2seq-lm", seq2seq_measures(m, rows, labels, kind_edit(m, scale, sources)))
    scalars = {k: v for k, v in fx.items() if v.ndim == 1}
    grids = None
    if grid is not None:
        shape = layout(m)[grid]
        grids = {k: v[2 if chosen else 1:].reshape(shape) for k, v in scalars.items()}
    return Ablation(m.name, "seq2seq-lm", tokens, target, mode, list(chosen),
                    {k: float(v[0]) for k, v in scalars.items() if not k.startswith("d_")},
                    {k: float(v[1]) for k, v in scalars.items()} if chosen else None, None, grids, grid)
