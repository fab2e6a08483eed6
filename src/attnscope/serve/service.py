"""The work behind each endpoint, run on the inference pool: trace (cached), explain, encode as JSON.

Everything here is blocking and returns response bytes, so the event loop only moves bytes.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import threading
from typing import Any

import numpy as np

from attnscope.errors import AttnscopeError
from attnscope.explain import walkthrough
from attnscope.models import Model, describe, load_model
from attnscope.render import walkthrough_json
from attnscope.serve.api import ExplainRequest, NeuronRequest, TraceRequest
from attnscope.serve.cache import CacheKey, Entry, TraceCache
from attnscope.serve.settings import Settings
from attnscope.stages import ARRAY_AXES, DERIVED
from attnscope.tracing import Trace, trace
from attnscope.views import neuron_block, payload


class Service:
    """The served models, their locks and the trace cache."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.models = load_models(settings.models)
        self.default = next(iter(self.models.values()))
        self.cache = TraceCache(settings.cache_entries, settings.cache_bytes)
        # capture hooks live on the model, so one model runs one forward pass at a time
        self._locks = {id(m): threading.Lock() for m in self.models.values()}

    @property
    def names(self) -> list[str]:
        """Every name a request may use for a model: the canonical names and the names given."""
        return list(self.models)

    def model_list(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for m in dict.fromkeys(self.models.values()):
            aliases = sorted(n for n, other in self.models.items() if other is m and n != m.name)
            out.append({**describe(m), "default": m is self.default, "aliases": aliases,
                        "max_length": min(self.settings.max_tokens, m.max_positions)})
        return out

    def model(self, name: str | None) -> Model:
        if name is None:
            return self.default
        if name not in self.models:  # the request validation already allows only these names
            raise AttnscopeError(f"model {name!r} is not served here: use one of {', '.join(self.names)}")
        return self.models[name]

    def entry(self, text: str, pair: str | None, model: str | None, max_length: int | None,
              truncate: bool) -> tuple[Model, Entry]:
        """The trace of this text, from the cache or from a forward pass."""
        m = self.model(model)
        n = max_length if max_length is not None else min(self.settings.max_tokens, m.max_positions)
        key: CacheKey = (m.name, text, pair, n, truncate)
        hit = self.cache.get(key)
        if hit is not None:
            return m, hit
        with self._locks[id(m)]:
            tr = trace(text, pair, model=m, max_length=n, truncate=truncate)
        e = Entry(tr, tr.check().to_dict())  # a trace keeps only its errors, so the check is cheap to keep
        self.cache.put(key, e)
        return m, e

    def trace_body(self, req: TraceRequest) -> bytes:
        _m, e = self.entry(req.text, req.pair, req.model, req.max_length, req.truncate)
        tr = e.trace
        body: dict[str, Any] = {
            "model": tr.model, "text": tr.text, "pair": tr.pair, "truncated": tr.truncated,
            "tokens": [t.to_dict() for t in tr.tokens], "check": e.check,
            "arrays": {s: encode_array(stage_array(tr, s), ARRAY_AXES[s], req.encoding) for s in req.stages},
        }
        if req.payload:
            body["payload"] = views_payload(e, tuple(s for s in DERIVED if s in req.sources))
        return to_json(body)

    def explain_body(self, req: ExplainRequest) -> bytes:
        m, e = self.entry(req.text, req.pair, req.model, req.max_length, req.truncate)
        w = walkthrough(e.trace, req.layer, req.head, req.token, model=m)
        return to_json(walkthrough_json(w))

    def neuron_body(self, req: NeuronRequest) -> bytes:
        _m, e = self.entry(req.text, req.pair, req.model, req.max_length, req.truncate)
        return to_json(neuron_block(e.trace, req.layer, req.head))


def load_models(specs: tuple[str, ...]) -> dict[str, Model]:
    """Load every served model up front, so a bad name fails at start and not on a request."""
    out: dict[str, Model] = {}
    for spec in specs or (None,):
        m = load_model(spec)
        out.setdefault(m.name, m)
        if spec is not None:
            out.setdefault(spec, m)
    return out


def stage_array(tr: Trace, stage: str) -> np.ndarray:
    """A stage's array; rollout, flow and norms are computed on request where installed."""
    if stage in tr.arrays:
        return tr.arrays[stage]
    try:
        if stage == "rollout":
            return tr.rollout()
        if stage == "flow":
            return tr.flow()
        if stage in ("norm_head", "norm_layer"):
            return tr.norms()[stage]
    except ImportError as exc:
        raise AttnscopeError(f"stage {stage!r} is not available in this installation of attnscope") from exc
    raise AttnscopeError(f"this trace has no {stage!r} array ({tr.model.get('architecture')}): "
                         f"ask for {', '.join(tr.arrays)}")


def encode_array(a: np.ndarray, axes: tuple[str, ...], encoding: str) -> dict[str, Any]:
    """One array with its axes: base64 of little-endian float32 (C order), or nested lists."""
    f32 = np.ascontiguousarray(a, dtype="<f4")
    data: Any = base64.b64encode(f32.tobytes()).decode("ascii") if encoding == "base64" else f32.tolist()
    return {"axes": list(axes), "shape": list(f32.shape), "dtype": "float32", "encoding": encoding,
            "data": data}


def views_payload(e: Entry, optional: tuple[str, ...]) -> dict[str, Any]:
    """The views' payload (attnscope.views.payload): raw weights plus the `optional` sources, computed here.

    Built once per entry and choice, so switching views, layers and heads costs no recompute.
    """
    if optional not in e.payloads:
        tr = e.trace
        for name in optional:
            stage_array(tr, name)
        keep = {k: v for k, v in tr.arrays.items() if k not in DERIVED or k in optional}
        e.payloads[optional] = payload(dataclasses.replace(tr, arrays=keep))
    return e.payloads[optional]


def to_json(body: Any) -> bytes:
    """Strict JSON: a NaN or infinity from the model is a server error, never hidden."""
    try:
        text = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError as exc:
        raise ArithmeticError(f"the model produced NaN or infinite numbers; cannot send them as JSON: {exc}") from exc
    return text.encode("utf-8")
