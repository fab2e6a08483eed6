"""Trace a real model on a text: capture, recompute, and keep everything for checks and views."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from attnscope import check as checking
from attnscope.capture import AttentionCall, LayerCapture, capturing
from attnscope.errors import AttnscopeError, check_index
from attnscope.families import family_of, is_causal
from attnscope.models import Model, ModelLike, describe, load_model
from attnscope.recompute import layer_params, recompute
from attnscope.tokens import Token, encode

# Saved arrays and their axes (see docs): the project's stage vocabulary.
ARRAY_AXES: dict[str, tuple[str, ...]] = {
    "x": ("layer", "token", "d_model"),
    "q": ("layer", "head", "token", "d_head"),
    "k": ("layer", "head", "token", "d_head"),
    "v": ("layer", "head", "token", "d_head"),
    "scores": ("layer", "head", "query", "key"),
    "weights": ("layer", "head", "query", "key"),
    "context": ("layer", "head", "token", "d_head"),
    "output": ("layer", "token", "d_model"),
    # derived views of the weights, saved when computed (attnscope.rollout, attnscope.norms)
    "rollout": ("layer", "query", "key"),
    "flow": ("query", "key"),
    "norm_head": ("layer", "head", "query", "key"),
    "norm_layer": ("layer", "query", "key"),
}


@dataclass
class Trace:
    """One text's attention in every layer and head, as the model computed it.

    `arrays` holds the captured numbers by stage name (axes in ARRAY_AXES); `recomputed`
    the independent recompute from each layer's weights; `reference` the model's own
    outputs (`output_attentions` as "weights", hidden states as "x").
    """

    model: dict[str, Any]
    text: str
    pair: str | None
    tokens: list[Token]
    arrays: dict[str, np.ndarray]
    scaling: list[float]  # per layer: the factor applied to scores (1 / sqrt(d_head) usually)
    truncated: bool = False
    recomputed: dict[str, np.ndarray] | None = None
    reference: dict[str, np.ndarray] = field(default_factory=dict)
    unsupported: str | None = None  # why there is no recompute
    saved_check: dict[str, Any] | None = None  # a loaded trace's stored verification

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
        if self.recomputed is None and not self.reference and self.saved_check is not None:
            return checking.report_from_dict(self.saved_check)  # a loaded trace: its stored check
        report = checking.CheckReport(tolerance=tolerance, unsupported=self.unsupported)
        if self.recomputed is not None:
            report.comparisons += checking.compare(self.arrays, self.recomputed, "recompute")
        report.comparisons += checking.compare(self.arrays, self.reference, "model")
        return report

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
        missing = [k for k in ("norm_head", "norm_layer") if k not in self.arrays]
        if missing:
            raise AttnscopeError(
                self.unsupported or "this trace has no norm-based attention: trace it again with this version"
            )
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
    truncate: bool = ..., tokenizer: PreTrainedTokenizerBase | None = ...,
) -> Trace: ...
@overload
def trace(
    text: Sequence[str], text_pair: Sequence[str | None] | None = ..., model: ModelLike = ...,
    max_length: int = ..., truncate: bool = ..., tokenizer: PreTrainedTokenizerBase | None = ...,
) -> list[Trace]: ...


def trace(
    text: str | Sequence[str],
    text_pair: str | Sequence[str | None] | None = None,
    model: ModelLike = None,
    max_length: int = 256,
    truncate: bool = True,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> Trace | list[Trace]:
    """Run the model on text (or a list of texts, as one padded batch) and trace its attention.

    text_pair gives second sentences (segment B, with token_type_ids). max_length counts
    tokens including special tokens; longer texts are truncated with a warning unless
    truncate=False, which makes them an error.
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
        out = m.model(**enc.inputs, output_attentions=True, output_hidden_states=True)
    rows = zip(texts, pairs or [None] * len(texts), strict=True)
    traces = [_row_trace(m, cap, out, enc, row, t, p) for row, (t, p) in enumerate(rows)]
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


def _row_trace(m: Model, cap: LayerCapture, out: Any, enc: Any, row: int, text: str, pair: str | None) -> Trace:
    tokens = enc.tokens[row]
    n = len(tokens)
    arrays = _captured_arrays(cap, row, n)
    info = _model_info(m, cap)
    reference = _reference_arrays(m, out, row, n, cap)
    tr = Trace(info, text, pair, tokens, arrays, [c.scaling for c in cap.calls], enc.truncated[row],
               reference=reference)
    params = layer_params(m.model)
    if params is None or "x" not in arrays:
        tr.unsupported = f"independent recompute not supported for {m.architecture}"
    else:
        x = torch.from_numpy(arrays["x"])
        rec = recompute(x, params, is_causal(m.model))
        tr.recomputed = {k: v.numpy() for k, v in rec.items()}
    return tr


def _captured_arrays(cap: LayerCapture, row: int, n: int) -> dict[str, np.ndarray]:
    """Unpad one row of the batch: keep its first n positions on every token axis."""
    def stack(ts: list[torch.Tensor]) -> np.ndarray:
        return torch.stack(ts).float().numpy()

    calls = [_expand_kv(c) for c in cap.calls]
    arrays = {
        "q": stack([c.q[row, :, :n] for c in calls]),  # [layer, head, token, d_head]
        "k": stack([c.k[row, :, :n] for c in calls]),
        "v": stack([c.v[row, :, :n] for c in calls]),
        "weights": stack([c.weights[row, :, :n, :n] for c in calls]),  # [layer, head, query, key]
        "context": stack([c.context[row, :, :n] for c in calls]),
    }
    arrays["scores"] = np.matmul(arrays["q"], arrays["k"].swapaxes(-1, -2))  # q k^T, [layer, head, query, key]
    if cap.x and len(cap.x) == len(calls):
        arrays["x"] = stack([x[row, :n] for x in cap.x])  # [layer, token, d_model]
    if cap.output and len(cap.output) == len(calls):
        arrays["output"] = stack([o[row, :n] for o in cap.output])
    return {k: np.ascontiguousarray(v) for k, v in arrays.items()}


def _expand_kv(call: AttentionCall) -> AttentionCall:
    """Grouped-query attention: repeat each key/value head for the query heads that share it."""
    groups = call.q.shape[1] // call.k.shape[1]
    if groups == 1:
        return call
    k, v = (t.repeat_interleave(groups, dim=1) for t in (call.k, call.v))
    return dataclasses.replace(call, k=k, v=v)


def _reference_arrays(m: Model, out: Any, row: int, n: int, cap: LayerCapture) -> dict[str, np.ndarray]:
    """The model's own outputs: output_attentions, and the hidden states each layer reads."""
    ref: dict[str, np.ndarray] = {}
    if getattr(out, "attentions", None):
        ref["weights"] = torch.stack([a[row, :, :n, :n] for a in out.attentions]).float().numpy()
    hidden = getattr(out, "hidden_states", None)
    fam = family_of(m.model)
    if hidden and fam is not None and len(hidden) > len(cap.calls):
        pre = fam.pre_attention
        xs = [_x_from_hidden(m, pre, i, h[row : row + 1, :n]) for i, h in enumerate(hidden[:-1])]
        ref["x"] = torch.cat(xs).float().numpy()  # [layer, token, d_model]
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
