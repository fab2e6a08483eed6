"""Trace -> compact JSON for the views: attention maps as uint8 per matrix, exact float32 for the neuron view.

Every [query, key] array of a trace (raw weights first, then rollout, flow and norms when
computed) becomes one "source": quantized to uint8 with one scale per matrix, zlib-deflated,
base64. The neuron view needs exact numbers, so it gets float32 q, k, scores and weights for a
budget of (layer, head) pairs; the page shows those values as they are and derives only
q*k and scores*scaling with float32 rounding (Math.fround), which reproduces numpy bit for bit.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from attnscope.errors import AttnscopeError, validate_index
from attnscope.stages import ARRAY_AXES, SOURCE_LABELS, SOURCES

if TYPE_CHECKING:
    from attnscope.records.trace import Trace
    from attnscope.tokens import Token

FORMAT = "attnscope.views/1"
VIEWS = ("head", "model", "neuron", "matrix", "all")
NOT_SOURCES = ("scores", "position_bias")  # logits and T5's bias, signed: shown exactly in the neuron view instead
NEURON_BUDGET = 2_000_000  # raw float32 bytes of neuron data a page carries by default
NEURON_STAGES = ("q", "k", "scores", "weights")
NEURON_EXTRA = ("v", "context", "position_bias")  # the weighted values' parts and T5's bias, when traced
NeuronChoice = str | Sequence[tuple[int, int]]  # "budget", "all", "none" or explicit (layer, head) pairs


@dataclass(frozen=True)
class Selection:
    """Which layers and heads (0-indexed, as in the trace) a payload carries."""

    layers: list[int]
    heads: list[int]


def select(trace: Trace, layers: Iterable[int] | None, heads: Iterable[int] | None) -> Selection:
    """Sorted, de-duplicated, range-checked layers and heads; None means all."""
    chosen_layers = sorted(set(range(trace.n_layers) if layers is None else layers))
    chosen_heads = sorted(set(range(trace.n_heads) if heads is None else heads))
    if not chosen_layers or not chosen_heads:
        raise AttnscopeError("no layers or no heads selected: pass at least one of each (0-indexed)")
    for layer in chosen_layers:
        validate_index("layer", layer, trace.n_layers)
    for head in chosen_heads:
        validate_index("head", head, trace.n_heads)
    return Selection(chosen_layers, chosen_heads)


def encode_bytes(raw: bytes, compress: bool) -> tuple[str, str]:
    """(suffix of the encoding, base64 text): "+zlib" when deflated."""
    if compress:
        return "+zlib", base64.b64encode(zlib.compress(raw, 6)).decode("ascii")
    return "", base64.b64encode(raw).decode("ascii")


def source_names(trace: Trace) -> list[str]:
    """The trace's [query, key] arrays that views can draw, raw weights first."""
    names = [n for n, axes in ARRAY_AXES.items()
             if n in trace.arrays and axes[-2:] == ("query", "key") and n not in NOT_SOURCES]
    return sorted(names, key=lambda n: (SOURCES.index(n) if n in SOURCES else len(SOURCES), n))


def _as_maps(name: str, array: np.ndarray, sel: Selection) -> np.ndarray:
    """Any source -> [layer, head, query, key]; a missing layer or head axis becomes length 1."""
    axes = ARRAY_AXES[name]
    out = array[sel.layers] if "layer" in axes else array[None]
    return out[:, sel.heads] if "head" in axes else out[:, None]


def _require_drawable(name: str, maps: np.ndarray, sel: Selection) -> None:
    """Views draw non-negative finite maps; say where one is not, never patch it."""
    bad = ~np.isfinite(maps) | (maps < 0)
    if not bad.any():
        return
    li, hi, qi, ki = (int(i[0]) for i in np.nonzero(bad))
    axes = ARRAY_AXES[name]
    where = [f"layer {sel.layers[li]}"] if "layer" in axes else []
    where += [f"head {sel.heads[hi]}"] if "head" in axes else []
    where += [f"query {qi}", f"key {ki}"]
    raise AttnscopeError(
        f"cannot draw {name!r}: it holds {maps[li, hi, qi, ki]} at {', '.join(where)}; views need finite values >= 0"
    )


def quantize(maps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[layer, head, query, key] floats >= 0 -> uint8 codes and one scale (the max) per matrix.

    A value decodes as code / 255 * scale, within scale / 510 of the original.
    """
    scales = maps.max(axis=(2, 3)).astype(np.float64)  # [layer, head]
    safe = np.where(scales > 0, scales, 1.0)[:, :, None, None]
    codes = np.rint(maps.astype(np.float64) / safe * 255.0).astype(np.uint8)
    return codes, scales


def source_payload(trace: Trace, name: str, sel: Selection, compress: bool) -> dict[str, Any]:
    maps = _as_maps(name, trace.arrays[name], sel)
    _require_drawable(name, maps, sel)
    codes, scales = quantize(maps)
    suffix, data = encode_bytes(codes.tobytes(), compress)
    axes = ARRAY_AXES[name]
    return {
        "name": name,
        "label": SOURCE_LABELS.get(name, name.replace("_", " ")),
        "axes": list(axes),
        "shape": list(codes.shape),
        "layers": sel.layers if "layer" in axes else [],
        "heads": sel.heads if "head" in axes else [],
        "range": "unit" if name == "weights" else "max",  # weights are drawn absolute, others per-matrix
        "scales": [float(s) for s in scales.ravel()],
        "encoding": "u8" + suffix,
        "data": data,
    }


def neuron_pairs(trace: Trace, sel: Selection, choice: NeuronChoice, first: tuple[int, int],
                 budget: int = NEURON_BUDGET) -> list[tuple[int, int]]:
    """The (layer, head) pairs whose exact numbers a page carries, the initial one first (within `budget` bytes)."""
    if any(s not in trace.arrays for s in NEURON_STAGES):
        return []
    everything = [(layer, head) for layer in sel.layers for head in sel.heads]
    everything.sort(key=lambda p: (p != first, p[0] != first[0], p))
    if isinstance(choice, str):
        if choice == "none":
            return []
        if choice == "all":
            return everything
        if choice != "budget":
            raise AttnscopeError(f"neuron={choice!r} is not understood: use 'budget', 'all', 'none' "
                                 "or (layer, head) pairs")
        per_pair = sum(trace.arrays[s][0, 0].nbytes for s in block_stages(trace))
        return everything[: max(1, budget // max(per_pair, 1))]
    pairs = [(int(layer), int(head)) for layer, head in choice]
    for layer, head in pairs:
        trace.validate(layer=layer, head=head)
    return pairs


def block_stages(trace: Trace) -> list[str]:
    """The stages a neuron block carries, in order: q, k, scores, weights, then v and context when traced."""
    return [*NEURON_STAGES, *(s for s in NEURON_EXTRA if s in trace.arrays)]


KEY_SIDE = ("k", "v")  # a neuron block's stages over the keys ([key, d_head]); the rest have a row per query


def neuron_arrays(trace: Trace, layer: int, head: int, query: int | None = None) -> dict[str, np.ndarray]:
    """A neuron block's stages of one head, in block_stages' order: q [token, d_head], k [key, d_head] (of the k/v
    head this head reads), scores, weights [query, key], then v [key, d_head], context [token, d_head] and
    position_bias [query, key] when traced. query: the query-side stages' row `query` alone ([1, ...]: the trace's
    own numbers, sliced), k and v still every key's."""
    trace.validate(layer=layer, head=head)
    if query is not None:
        validate_index("query token", query, trace.n_tokens, owner="this text")
    missing = [s for s in NEURON_STAGES if s not in trace.arrays]
    if missing:
        raise AttnscopeError(f"this trace has no {', '.join(missing)}: the neuron view needs q and k (trace a model)")
    kv = trace.kv_head(head)  # grouped-query attention: k comes from the k/v head this query head reads
    rows = slice(None) if query is None else slice(query, query + 1)
    return {s: trace.arrays[s][layer, kv] if s in KEY_SIDE else trace.arrays[s][layer, head, rows]
            for s in block_stages(trace)}


def neuron_block(trace: Trace, layer: int, head: int, compress: bool = True,
                 query: int | None = None) -> dict[str, Any]:
    """Exact float32 q, k [token, d_head], scores, weights [query, key] (then v, context [token, d_head] and
    T5's position_bias [query, key] when traced) of one head, concatenated in the order of its "stages".
    Cross-attention: k and v run over the source tokens, scores, weights and the bias are [target, source].
    query: q, context, scores, weights and the bias hold that query's row only, and the block says "query"."""
    arrays = neuron_arrays(trace, layer, head, query)
    parts = [np.ascontiguousarray(a, dtype="<f4") for a in arrays.values()]
    suffix, data = encode_bytes(b"".join(p.tobytes() for p in parts), compress)
    return {**neuron_fields(trace, layer, head, arrays, query), "encoding": "f32" + suffix, "data": data}


def neuron_fields(trace: Trace, layer: int, head: int, arrays: dict[str, np.ndarray],
                  query: int | None = None) -> dict[str, Any]:
    """A neuron block's fields besides its data (neuron_arrays' `arrays`): layer, head, scaling, d_head, kv_head,
    stages, and query when the block holds one query's row."""
    return {"layer": layer, "head": head, "scaling": float(trace.scaling[layer]), "d_head": int(arrays["q"].shape[-1]),
            "kv_head": trace.kv_head(head), "stages": list(arrays), **({} if query is None else {"query": query})}


def _json_number(x: float) -> float | str:
    """JSON has no NaN or infinity: pass them as strings the page shows as they are."""
    return float(x) if np.isfinite(x) else str(float(x))


def check_payload(trace: Trace, sel: Selection) -> dict[str, Any]:
    """trace.check() for the badge. ok is None (no badge) when the independent recompute did not run:
    then `unsupported` says why, and max_error is what remains (capture vs the model's own outputs)."""
    report = trace.check()
    compared = bool(report.comparisons)
    return {
        "ok": report.ok if report.verified else None,
        "status": report.status,  # PASS, FAIL or NOT VERIFIED, as `attnscope check` says
        "tolerance": report.tolerance,
        "max_error": _json_number(report.max_error) if compared else None,
        "unsupported": report.unsupported if report.unsupported or not compared else None,
        "head_errors": [[_json_number(report.head_error(layer, head)) for head in sel.heads]
                        for layer in sel.layers] if compared else None,
    }


def _model_info(trace: Trace) -> dict[str, Any]:
    return {k: v for k, v in trace.model.items() if isinstance(v, str | int | float | bool) or v is None}


def payload(
    trace: Trace,
    layers: Iterable[int] | None = None,
    heads: Iterable[int] | None = None,
    neuron: NeuronChoice = "budget",
    compress: bool = True,
    initial: dict[str, Any] | None = None,
    budget: int = NEURON_BUDGET,
    raw_tokens: bool = False,
) -> dict[str, Any]:
    """A JSON-serialisable description of a trace that `window.attnscope.render` draws.

    layers, heads: which to carry (0-indexed; None = all). neuron: exact float32 data for the
    neuron view, "budget" (NEURON_BUDGET bytes, the initial layer first), "all", "none" or a
    list of (layer, head). initial: the page's starting state (view, layer, head, heads,
    query, source, theme), validated here. raw_tokens: show each token as the tokenizer spells it ("Ġworld")
    rather than as it reads (" world", the tokenizer's decoding of the piece).
    """
    sel = select(trace, layers, heads)
    start = initial_state(trace, sel, initial or {})
    names = source_names(trace)
    if start["source"] is not None and start["source"] not in names:
        raise AttnscopeError(f"source {start['source']!r} is not in this trace: it has {', '.join(names)}")
    pairs = neuron_pairs(trace, sel, neuron, (start["layer"], start["head"]), budget)
    return key_token_fields(trace, raw_tokens) | {
        "format": FORMAT,
        "model": _model_info(trace),
        "text": trace.text,
        "pair": trace.pair,
        "truncated": bool(trace.truncated),
        "tokens": token_texts(trace.tokens, raw_tokens),
        "raw_tokens": raw_tokens,
        "segments": [int(t.segment) for t in trace.tokens],
        "special": [bool(t.special) for t in trace.tokens],
        "causal": trace.causal and trace.key_tokens is None,  # cross-attention sees every source token
        "layers": sel.layers,
        "heads": sel.heads,
        "sources": [source_payload(trace, name, sel, compress) for name in names],
        "neuron": {"blocks": [neuron_block(trace, layer, head, compress) for layer, head in pairs],
                   "complete": len(pairs) == len(sel.layers) * len(sel.heads),
                   "available": all(s in trace.arrays for s in NEURON_STAGES)},
        "check": check_payload(trace, sel),
        "initial": start,
    }


def token_texts(tokens: Sequence[Token], raw: bool = False) -> list[str]:
    """Each token as the views show it: as it reads (the tokenizer's decoding, Token.shown), or raw, as the
    tokenizer spells the piece (byte-level marks such as "Ġ" for a space and "Ċ" for a newline)."""
    return [t.text if raw else t.shown for t in tokens]


def key_token_fields(trace: Trace, raw_tokens: bool = False) -> dict[str, Any]:
    """Which attention this is, and for cross-attention the source tokens its keys run over (else the tokens)."""
    fields: dict[str, Any] = {"attention": trace.attention}
    if trace.key_tokens is not None:
        fields |= {"key_tokens": token_texts(trace.key_tokens, raw_tokens),
                   "key_special": [bool(t.special) for t in trace.key_tokens],
                   "key_segments": [int(t.segment) for t in trace.key_tokens]}
    return fields


def initial_state(trace: Trace, sel: Selection, given: dict[str, Any]) -> dict[str, Any]:
    """The starting view state, every index checked against what the payload carries."""
    known = {"view", "layer", "head", "heads", "query", "source", "theme"}
    unknown = sorted(set(given) - known)
    if unknown:
        raise AttnscopeError(f"unknown view option {unknown[0]!r}: use one of {', '.join(sorted(known))}")
    layer = _member("layer", given.get("layer"), sel.layers)
    head = _member("head", given.get("head"), sel.heads)
    shown = given.get("heads")
    shown_heads = sel.heads if shown is None else [_member("head", h, sel.heads) for h in shown]
    query = given.get("query")
    if query is not None:
        trace.validate(token=int(query))
    view = given.get("view") or "all"
    if view not in VIEWS:
        raise AttnscopeError(f"unknown view {view!r}: choose one of {', '.join(VIEWS)}")
    theme = given.get("theme") or "auto"
    if theme not in ("auto", "light", "dark"):
        raise AttnscopeError(f"theme {theme!r} is not known: use auto, light or dark")
    return {"view": view, "layer": layer, "head": head, "heads": shown_heads,
            "query": None if query is None else int(query), "source": given.get("source"), "theme": theme}


def _member(kind: str, value: Any, allowed: list[int]) -> int:
    """value (or the first allowed one when None) checked to be among the carried layers/heads."""
    if value is None:
        return allowed[0]
    if int(value) not in allowed:
        raise AttnscopeError(f"{kind} {value} is not in this view: it shows {kind}s {allowed} (0-indexed)")
    return int(value)
