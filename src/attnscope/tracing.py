"""Trace a real model on a text: capture, recompute, and keep everything for checks and views."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from attnscope import check as checking
from attnscope.arrays import row_arrays
from attnscope.capture import AttentionCall, LayerCapture, capturing
from attnscope.errors import AttnscopeError, check_index
from attnscope.families import family_of, is_causal
from attnscope.maths import AttentionParams
from attnscope.models import Model, ModelLike, describe, load_model
from attnscope.recompute import layer_params
from attnscope.tokens import Token, encode


@dataclass
class Trace:
    """One text's attention in every layer and head, as the model computed it.

    `arrays` holds the captured numbers by stage name (axes in ARRAY_AXES); `comparisons`
    the max errors, per layer and head, of the independent recompute from each layer's
    weights and of the model's own outputs (`output_attentions`, hidden states) against them.
    """

    model: dict[str, Any]
    text: str
    pair: str | None
    tokens: list[Token]
    arrays: MutableMapping[str, np.ndarray]  # a TraceArrays when traced: copied out of the batch on first use
    scaling: list[float]  # per layer: the factor applied to scores (1 / sqrt(d_head) usually)
    truncated: bool = False
    comparisons: list[checking.Comparison] = field(default_factory=list)
    unsupported: str | None = None  # why there is no recompute
    saved_check: dict[str, Any] | None = None  # a loaded trace's stored verification
    output_projection: list[np.ndarray] | None = None  # W_O per layer [head * d_head, d_model], for norms()

    @property
    def n_layers(self) -> int:
        return int(self.arrays["weights"].shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.arrays["weights"].shape[1])

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def causal(self) -> bool:
        return bool(self.model.get("causal", False))

    @property
    def weights(self) -> np.ndarray:
        """[layer, head, query, key]"""
        return self.arrays["weights"]

    @property
    def token_strings(self) -> list[str]:
        return [t.text for t in self.tokens]

    def head(self, layer: int, head: int) -> np.ndarray:
        """Attention weights of one head: [query, key]. Layers and heads are 0-indexed."""
        self.validate(layer=layer, head=head)
        head_weights: np.ndarray = self.arrays["weights"][layer, head]
        return head_weights

    def validate(self, layer: int | None = None, head: int | None = None, token: int | None = None) -> None:
        """Raise a one-line error when a layer, head or token index is out of range."""
        if layer is not None:
            check_index("layer", layer, self.n_layers)
        if head is not None:
            check_index("head", head, self.n_heads)
        if token is not None:
            check_index("token", token, self.n_tokens, owner="this text")

    def check(self, tolerance: float = checking.TOLERANCE) -> checking.CheckReport:
        """Recompute vs capture vs the model's own outputs, per layer, head and stage."""
        if not self.comparisons and self.saved_check is not None:  # a loaded trace: its stored check
            saved = checking.report_from_dict(self.saved_check)
            return checking.CheckReport(tolerance, saved.comparisons, saved.unsupported)
        return checking.CheckReport(tolerance, list(self.comparisons), self.unsupported)

    # Views (attnscope.views): self-contained HTML pages, in files and in Jupyter.
    def to_html(self, view: str = "all", **options: Any) -> str:
        """A self-contained HTML page: view is "head", "model", "neuron", "matrix" or "all"."""
        from attnscope.views import to_html

        return to_html(self, view=view, **options)

    def _repr_html_(self) -> str:
        from attnscope.views import repr_html

        return repr_html(self)

    def show(self, view: str = "head", **options: Any) -> Any:
        """Display a view in Jupyter."""
        from attnscope.views import show

        return show(self, view=view, **options)

    # Beyond raw weights (attnscope.rollout, attnscope.norms); results are kept in `arrays`.
    def rollout(self) -> np.ndarray:
        """Attention rollout (Abnar & Zuidema 2020): [layer, query, key], layer l = R_l."""
        from attnscope.rollout import rollout

        if "rollout" not in self.arrays:
            self.arrays["rollout"] = rollout(self.arrays["weights"])
        return self.arrays["rollout"]

    def flow(self, max_tokens: int = 64) -> np.ndarray:
        """Attention flow (Abnar & Zuidema 2020) from each top-layer position to each input: [query, key]."""
        from attnscope.rollout import flow

        if "flow" not in self.arrays:
            self.arrays["flow"] = flow(self.arrays["weights"], max_tokens=max_tokens)
        return self.arrays["flow"]

    def norms(self) -> dict[str, np.ndarray]:
        """Norm-based attention (Kobayashi et al. 2020), computed at trace time from the layer weights.

        "norm_head": ||alpha_ij f^h(x_j)|| [layer, head, query, key];
        "norm_layer": ||sum_h alpha^h_ij f^h(x_j)|| [layer, query, key].
        """
        from attnscope.norms import norm_attention

        if "norm_head" not in self.arrays:
            if self.output_projection is None:
                raise AttnscopeError(f"norm-based attention needs the layers' output projections: "
                                     f"{self.unsupported or 'trace the text again with the model at hand'}")
            self.arrays.update(norm_attention(self.arrays["v"], self.arrays["weights"], self.output_projection))
        return {k: self.arrays[k] for k in ("norm_head", "norm_layer")}

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write `.safetensors` or `.npz` (arrays by stage name, metadata as JSON)."""
        from attnscope.storage import save_trace

        save_trace(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Trace:
        from attnscope.storage import load_trace

        return load_trace(path)

    def __repr__(self) -> str:
        return (
            f"Trace(model={self.model.get('name')!r}, tokens={self.n_tokens}, "
            f"layers={self.n_layers}, heads={self.n_heads})"
        )


@overload
def trace(  # type: ignore[overload-overlap]
    text: str, text_pair: str | None = ..., model: ModelLike = ..., max_length: int = ...,
    truncate: bool = ..., tokenizer: PreTrainedTokenizerBase | None = ..., recompute: bool = ...,
) -> Trace: ...
@overload
def trace(
    text: Sequence[str], text_pair: Sequence[str | None] | None = ..., model: ModelLike = ...,
    max_length: int = ..., truncate: bool = ..., tokenizer: PreTrainedTokenizerBase | None = ...,
    recompute: bool = ...,
) -> list[Trace]: ...


def trace(
    text: str | Sequence[str],
    text_pair: str | Sequence[str | None] | None = None,
    model: ModelLike = None,
    max_length: int = 256,
    truncate: bool = True,
    tokenizer: PreTrainedTokenizerBase | None = None,
    recompute: bool = True,
) -> Trace | list[Trace]:
    """Run the model on text (or a list of texts, as one padded batch) and trace its attention.

    text_pair gives second sentences (segment B, with token_type_ids). max_length counts
    tokens including special tokens; longer texts are truncated with a warning unless
    truncate=False, which makes them an error. recompute=False keeps only what the forward pass
    captured (no independent recompute, no norm-based attention).
    """
    single = isinstance(text, str)
    texts = [text] if isinstance(text, str) else list(text)
    if not texts:
        raise AttnscopeError("no text given: pass a sentence or a non-empty list of sentences")
    pairs: list[str | None] | None
    if single:
        pairs = [text_pair] if isinstance(text_pair, str) or text_pair is None else list(text_pair)
    else:
        pairs = list(text_pair) if text_pair is not None and not isinstance(text_pair, str) else None
    m = load_model(model, tokenizer)
    max_length = _usable_max_length(m, max_length)
    enc = encode(m.tokenizer, texts, pairs, max_length, truncate)
    with torch.no_grad(), capturing(m.model) as cap:
        out = m.model(**enc.inputs, output_attentions=recompute, output_hidden_states=recompute)
    layers = _per_layer(cap)  # stage -> [batch, ...] per layer
    lengths = [len(t) for t in enc.tokens]
    params = layer_params(m.model) if recompute else None
    table = None
    if recompute:
        reference = _model_outputs(m, out, len(cap.calls))
        table = checking.verify_batch(layers, reference, params, is_causal(m.model), enc.inputs["attention_mask"])
    info, scaling = _model_info(m, cap), [c.scaling for c in cap.calls]
    w_o = [p.w_o.numpy() for p in params] if params is not None else None
    unsupported = _why_unverified(m, recompute, params, layers)
    traces = [
        Trace(info, t, p, enc.tokens[row], row_arrays(layers, row, lengths[row]), scaling, enc.truncated[row],
              comparisons=table.comparisons(row) if table else [], unsupported=unsupported, output_projection=w_o)
        for row, (t, p) in enumerate(zip(texts, pairs or [None] * len(texts), strict=True))
    ]
    return traces[0] if single else traces


def _usable_max_length(m: Model, max_length: int) -> int:
    if max_length < 2:
        raise AttnscopeError(f"--max-length {max_length} is too small: use at least 2 tokens")
    if max_length > m.max_positions:
        raise AttnscopeError(
            f"--max-length {max_length} exceeds what {m.name} can read ({m.max_positions} positions): "
            f"use at most {m.max_positions}"
        )
    return max_length


def _why_unverified(m: Model, requested: bool, params: list[AttentionParams] | None,
                    layers: dict[str, list[torch.Tensor]]) -> str | None:
    if not requested:
        return "not verified: traced with recompute=False"
    if params is None or "x" not in layers:
        return f"independent recompute not supported for {m.architecture}"
    return None


def _per_layer(cap: LayerCapture) -> dict[str, list[torch.Tensor]]:
    """Captured stages of the padded batch: stage -> one [batch, ...] tensor per layer (no copies).

    scores (q k^T) are not here: the trace and the check each compute them from q and k when needed.
    """
    calls = [_expand_kv(c) for c in cap.calls]
    out = {s: [getattr(c, s) for c in calls] for s in ("q", "k", "v", "weights", "context")}
    for stage, ts in (("x", cap.x), ("output", cap.output)):
        if ts and len(ts) == len(calls):
            out[stage] = ts  # [batch, token, d_model] per layer
    return out


def _expand_kv(call: AttentionCall) -> AttentionCall:
    """Grouped-query attention: repeat each key/value head for the query heads that share it."""
    groups = call.q.shape[1] // call.k.shape[1]
    if groups == 1:
        return call
    k, v = (t.repeat_interleave(groups, dim=1) for t in (call.k, call.v))
    return dataclasses.replace(call, k=k, v=v)


def _model_outputs(m: Model, out: Any, n_layers: int) -> dict[str, list[torch.Tensor]]:
    """The model's own outputs per layer: output_attentions, and the attention input its hidden states imply."""
    ref: dict[str, list[torch.Tensor]] = {}
    if getattr(out, "attentions", None):
        ref["weights"] = list(out.attentions)  # [batch, head, query, key] per layer
    hidden = getattr(out, "hidden_states", None)
    fam = family_of(m.model)
    if hidden and fam is not None and len(hidden) > n_layers:
        ref["x"] = [_x_from_hidden(m, fam.pre_attention, i, h) for i, h in enumerate(hidden[:n_layers])]
    return ref


def _x_from_hidden(m: Model, pre_attention: str | None, layer: int, hidden: torch.Tensor) -> torch.Tensor:
    """The attention input the model's own hidden state implies: itself, or after a pre-LayerNorm."""
    if pre_attention is None:
        return hidden
    with torch.no_grad():
        out: torch.Tensor = m.model.get_submodule(pre_attention.format(layer=layer))(hidden)
    return out


def _causal(m: Model, cap: LayerCapture) -> bool:
    """The family's causality; for other families, the attention module's own is_causal flag."""
    if family_of(m.model) is not None or not cap.calls:
        return is_causal(m.model)
    return bool(getattr(cap.calls[0].module, "is_causal", False))


def _model_info(m: Model, cap: LayerCapture) -> dict[str, Any]:
    info = describe(m)
    fam = family_of(m.model)
    q = cap.calls[0].q if cap.calls else None
    info.update(
        family=fam.name if fam else None,
        x_source=fam.x_source if fam else None,
        causal=_causal(m, cap),
        d_head=int(q.shape[-1]) if q is not None else None,
        d_model=int(cap.x[0].shape[-1]) if cap.x else None,
        layers=len(cap.calls),
    )
    return info
