"""The Trace: one text's tokens, captured arrays and verification, as a plain record (torch-free).

`attnscope.tracing.one_pass.trace` makes one from a model; `Trace.save` and `load_trace` write and read them (the
file format is records.files: arrays named by stage, with the axes of `attnscope.stages.ARRAY_AXES`, plus
`input_ids` [token]; an encoder-decoder trace keeps its three kinds apart by prefix: `encoder.weights`,
`cross.memory`, ..., its metadata one entry per kind under "kinds"). Views and saved-trace readers import this
module without loading torch or transformers.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.errors import AttnscopeError, validate_index
from attnscope.records import check_report as report
from attnscope.records import files
from attnscope.stages import ARRAY_AXES, ATTENTION_KINDS
from attnscope.tokens import Token


@dataclass(kw_only=True)
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
    comparisons: list[report.Comparison] = field(default_factory=list)
    unsupported: str | None = None  # why there is no recompute
    saved_check: dict[str, Any] | None = None  # a loaded trace's stored verification
    output_projection: list[np.ndarray] | None = None  # W_O per layer [head * d_head, d_model], for norms()
    attention: str = "self"  # "self", or which of an encoder-decoder's three (stages.ATTENTION_KINDS)
    key_tokens: list[Token] | None = None  # cross-attention: the source tokens the keys run over (else `tokens`)

    @property
    def n_layers(self) -> int:
        return int(self.arrays["weights"].shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.arrays["weights"].shape[1])

    @property
    def kv_heads(self) -> int:
        """k/v heads: fewer than n_heads with grouped-query attention (k and v are [layer, kv_head, ...])."""
        return int(self.arrays["k"].shape[1]) if "k" in self.arrays else self.n_heads

    def kv_head(self, head: int) -> int:
        """The k/v head query head `head` reads (0-indexed): head // (n_heads / kv_heads)."""
        validate_index("head", head, self.n_heads)
        return head // max(1, self.n_heads // self.kv_heads)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def keys(self) -> list[Token]:
        """The tokens the keys run over: the source's for cross-attention, the queries' own otherwise."""
        return self.tokens if self.key_tokens is None else self.key_tokens

    @property
    def n_keys(self) -> int:
        return len(self.keys)

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
            validate_index("layer", layer, self.n_layers)
        if head is not None:
            validate_index("head", head, self.n_heads)
        if token is not None:
            validate_index("token", token, self.n_tokens, owner="this text")

    def check(self, tolerance: float | None = None) -> report.CheckReport:
        """Recompute vs capture vs the model's own outputs, per layer, head and stage.

        tolerance: by default report.tolerance_for the dtype the model ran in (1e-5 for float32).
        """
        if tolerance is None:
            tolerance = report.tolerance_for(str(self.model.get("dtype") or "float32"))
        if not self.comparisons and self.saved_check is not None:  # a loaded trace: its stored check
            saved = report.report_from_dict(self.saved_check)
            return report.CheckReport(tolerance, saved.comparisons, saved.unsupported)
        return report.CheckReport(tolerance, list(self.comparisons), self.unsupported)

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

        self._require_square("attention rollout")
        if "rollout" not in self.arrays:
            self.arrays["rollout"] = rollout(self.arrays["weights"])
        return self.arrays["rollout"]

    def flow(self, max_tokens: int = 64) -> np.ndarray:
        """Attention flow (Abnar & Zuidema 2020) from each top-layer position to each input: [query, key]."""
        from attnscope.rollout import flow, validate_flow_length

        self._require_square("attention flow")
        validate_flow_length(self.n_tokens, max_tokens)  # a cached result obeys the limit of this call too
        if "flow" not in self.arrays:
            self.arrays["flow"] = flow(self.arrays["weights"], max_tokens=max_tokens)
        return self.arrays["flow"]

    def _require_square(self, what: str) -> None:
        if self.attention == "cross":
            raise AttnscopeError(f"{what} composes a stack's self-attention layers: cross-attention's [target, source] "
                                 "maps do not compose; use the encoder's or the decoder's trace")

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
            v = self.arrays["v"]  # [layer, kv_head, key, d_head]
            if self.kv_heads != self.n_heads:  # grouped-query attention: one per query head
                v = np.repeat(v, self.n_heads // self.kv_heads, axis=1)
            self.arrays.update(norm_attention(v, self.arrays["weights"], self.output_projection))
        return {k: self.arrays[k] for k in ("norm_head", "norm_layer")}

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write `.safetensors` or `.npz` (arrays by stage name, metadata as JSON)."""
        save_trace(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Trace:
        return load_trace(path)

    def __repr__(self) -> str:
        kind = "" if self.attention == "self" else f"attention={self.attention!r}, "
        return (
            f"Trace(model={self.model.get('name')!r}, {kind}tokens={self.n_tokens}, "
            f"layers={self.n_layers}, heads={self.n_heads})"
        )


@dataclass(kw_only=True)
class EncoderDecoderTrace:
    """An encoder-decoder model (T5, BART, Marian) on a source and a target: its three kinds of attention.

    encoder: self-attention over the source tokens; decoder: causal self-attention over the target
    (decoder input) tokens; cross: each target token's attention over the source tokens (weights
    [layer, head, target, source], `cross.key_tokens` are the source tokens). Each is a Trace with its
    own arrays and check.
    """

    model: dict[str, Any]
    source: str
    target: str | None  # the text given as target, or None when it was generated
    encoder: Trace
    decoder: Trace
    cross: Trace

    @property
    def kinds(self) -> dict[str, Trace]:
        """"encoder", "decoder", "cross" -> its Trace, in that order."""
        return {"encoder": self.encoder, "decoder": self.decoder, "cross": self.cross}

    @property
    def generated(self) -> bool:
        """True when the model generated the target (greedily) rather than being given one."""
        return self.target is None

    @property
    def target_text(self) -> str:
        """The target: as given, or the generated text (special tokens skipped)."""
        return self.target if self.target is not None else self.decoder.text

    def check(self, tolerance: float | None = None) -> dict[str, report.CheckReport]:
        """Each kind's verification: "encoder", "decoder", "cross" -> its CheckReport."""
        return {kind: tr.check(tolerance) for kind, tr in self.kinds.items()}

    def status(self, tolerance: float | None = None) -> str:
        """FAIL when any kind fails; else NOT VERIFIED when any kind is not verified; else PASS."""
        statuses = {r.status for r in self.check(tolerance).values()}
        return next(s for s in (report.FAIL, report.NOT_VERIFIED, report.PASS) if s in statuses)

    def attention(self, kind: str) -> Trace:
        """One kind of attention: "encoder", "decoder" or "cross"."""
        if kind not in self.kinds:
            raise AttnscopeError(f"attention {kind!r} is not one of an encoder-decoder's: use encoder, decoder "
                                 "or cross")
        return self.kinds[kind]

    # Views (attnscope.views): one page with the three kinds and a selector, as Trace's.
    def to_html(self, view: str = "all", **options: Any) -> str:
        """A self-contained HTML page: view is "head", "model", "neuron", "matrix" or "all"; attention= the kind
        drawn first ("encoder", "decoder" or "cross")."""
        from attnscope.views import to_html

        return to_html(self, view=view, **options)

    def _repr_html_(self) -> str:
        from attnscope.views import repr_html

        return repr_html(self)

    def show(self, view: str = "head", **options: Any) -> Any:
        """Display a view in Jupyter."""
        from attnscope.views import show

        return show(self, view=view, **options)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write `.safetensors` or `.npz`: each kind's arrays prefixed by its name (`cross.weights`)."""
        save_trace(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> EncoderDecoderTrace:
        return load_encoder_decoder(path)

    def __repr__(self) -> str:
        return (f"EncoderDecoderTrace(model={self.model.get('name')!r}, source_tokens={self.encoder.n_tokens}, "
                f"target_tokens={self.decoder.n_tokens}, layers={self.encoder.n_layers}/{self.decoder.n_layers})")


# Files (records.files): what a trace's arrays and metadata hold.
def file_metadata(tr: Trace) -> dict[str, Any]:
    """A trace's metadata in its file: the record's fields, the axes, and its check."""
    return {
        "format": files.FORMAT_VERSION,
        "model": tr.model,
        "text": tr.text,
        "pair": tr.pair,
        "tokens": [t.to_dict() for t in tr.tokens],
        "scaling": tr.scaling,
        "truncated": tr.truncated,
        "unsupported": tr.unsupported,
        "axes": {k: list(v) for k, v in ARRAY_AXES.items()},
        "check": tr.check().to_dict(),
        **({} if tr.attention == "self" else {"attention": tr.attention}),
        **({} if tr.key_tokens is None else {"key_tokens": [t.to_dict() for t in tr.key_tokens]}),
    }


def file_arrays(tr: Trace, prefix: str = "") -> dict[str, np.ndarray]:
    """A trace's arrays by stage name, plus input_ids [token]; prefix names an encoder-decoder's kind."""
    arrays = {prefix + k: np.ascontiguousarray(v) for k, v in tr.arrays.items()}
    arrays[prefix + "input_ids"] = np.asarray([t.id for t in tr.tokens], dtype=np.int64)
    return arrays


def save_trace(tr: Trace | EncoderDecoderTrace, path: str | os.PathLike[str]) -> None:
    """Write a trace, or an encoder-decoder trace (its kinds' arrays prefixed by kind: `cross.weights`)."""
    if isinstance(tr, EncoderDecoderTrace):
        arrays: dict[str, np.ndarray] = {}
        for kind, t in tr.kinds.items():
            arrays.update(file_arrays(t, f"{kind}."))
        meta: dict[str, Any] = {"format": files.FORMAT_VERSION, "model": tr.model, "source": tr.source,
                                "target": tr.target, "kinds": {kind: file_metadata(t) for kind, t in tr.kinds.items()}}
        tokens = {f"{kind}.tokens": [tok.text for tok in t.tokens] for kind, t in tr.kinds.items()}
    else:
        arrays, meta, tokens = file_arrays(tr), file_metadata(tr), {"tokens": tr.token_strings}
    files.write(Path(path), arrays, meta, tokens)


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """A saved Trace (an encoder-decoder file: one line saying to use load_encoder_decoder)."""
    return load_trace_and_metadata(path)[0]


def load_trace_and_metadata(path: str | os.PathLike[str]) -> tuple[Trace, dict[str, Any]]:
    """A saved Trace and its file's metadata (where a generation file keeps its steps:
    attnscope.records.generation), read once."""
    loaded, meta = _load(Path(path))
    if isinstance(loaded, EncoderDecoderTrace):
        raise AttnscopeError(f"{path} holds an encoder-decoder trace (encoder, decoder and cross-attention): load it "
                             "with attnscope.EncoderDecoderTrace.load")
    return loaded, meta


def load_encoder_decoder(path: str | os.PathLike[str]) -> EncoderDecoderTrace:
    """A saved EncoderDecoderTrace (a plain trace's file: one line saying so)."""
    loaded = load(path)
    if not isinstance(loaded, EncoderDecoderTrace):
        raise AttnscopeError(f"{path} holds a trace of one kind of attention, not an encoder-decoder trace: load it "
                             "with attnscope.Trace.load")
    return loaded


def load(path: str | os.PathLike[str]) -> Trace | EncoderDecoderTrace:
    """Whichever the file holds: a Trace, or an EncoderDecoderTrace."""
    return _load(Path(path))[0]


def _load(p: Path) -> tuple[Trace | EncoderDecoderTrace, dict[str, Any]]:
    """What the file holds, and its metadata."""
    arrays, meta = files.read(p)
    try:
        loaded = _encoder_decoder_from(arrays, meta) if "kinds" in meta else _trace_from(arrays, meta)
    except (ValueError, KeyError, TypeError) as exc:
        raise AttnscopeError(f"{p} is not an attnscope trace: {type(exc).__name__} {exc}") from exc
    return loaded, meta


def _encoder_decoder_from(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> EncoderDecoderTrace:
    kinds = {}
    for kind in ATTENTION_KINDS:
        prefix = f"{kind}."
        own = {k.removeprefix(prefix): v for k, v in arrays.items() if k.startswith(prefix)}
        kinds[kind] = _trace_from(own, meta["kinds"][kind])
    return EncoderDecoderTrace(model=meta["model"], source=meta["source"], target=meta.get("target"), **kinds)


def _trace_from(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> Trace:
    tokens = [Token(**t) for t in meta["tokens"]]
    stages = {k: v for k, v in arrays.items() if k in ARRAY_AXES}
    keys = [Token(**t) for t in meta["key_tokens"]] if meta.get("key_tokens") is not None else None
    tr = Trace(model=meta["model"], text=meta["text"], pair=meta.get("pair"), tokens=tokens, arrays=stages,
               scaling=list(meta["scaling"]), truncated=bool(meta.get("truncated", False)),
               unsupported=meta.get("unsupported"),
               attention=str(meta.get("attention", "self")), key_tokens=keys)
    tr.saved_check = meta.get("check")
    if tr.saved_check is not None:
        report.report_from_dict(tr.saved_check)  # validate now, not when a view asks
    return tr
