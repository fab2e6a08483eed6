"""The work behind each endpoint, run on the inference pool: trace (cached), explain, encode as JSON.

Everything here is blocking and returns response bytes, so the event loop only moves bytes.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnscope.errors import AttnscopeError
from attnscope.explain.from_trace import walkthrough
from attnscope.explain.render import walkthrough_json, walkthrough_shown_json
from attnscope.models import Model, describe, load_model
from attnscope.serve import binary, maps, rows, wordmaps
from attnscope.serve.api import ExplainRequest, NeuronRequest, TextRequest, TraceRequest
from attnscope.serve.cache import CacheKey, Entry, TraceCache
from attnscope.serve.encode import encode_array, stage_array, to_json
from attnscope.serve.pool import checkpoint
from attnscope.serve.seq2seq import is_seq2seq, seq2seq_body
from attnscope.serve.settings import Settings
from attnscope.stages import ARRAY_AXES, DERIVED, SOURCES
from attnscope.tokens import encode
from attnscope.tracing import streamed
from attnscope.tracing.one_pass import Trace, forward_pass
from attnscope.views import neuron_block, payload
from attnscope.views.payload import NEURON_STAGES
from attnscope.views.payload import source_names as payload_sources
from attnscope.views.words import word_trace

_BASE64_BYTES = 16 / 3  # JSON bytes per float32 value: 4 bytes, base64
_LIST_BYTES = 16  # at most, as a JSON number in a list: "-1.2345678e-05," (float32 repr)
# a neuron block is deflated up to this many [query, key] values per map: beyond, zlib costs seconds (SmolLM2 at
# 2,048 tokens: ~3 s for its 34 MB) and loopback carries the bytes in a fraction of that
_NEURON_ZLIB_UP_TO = 2**20


class Service:
    """The served models, their locks and the trace cache."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.models = load_models(settings.models)
        self.default = next(iter(self.models.values()))
        self.cache = TraceCache(settings.cache_entries, settings.cache_bytes)
        self.maps = maps.MapStore(settings.cache_entries, settings.cache_bytes)  # long traces' maps, uint8
        self.heads = rows.RecentHeads()  # heads recomputed from a long trace's kept x, for the next request
        self.budget = Budget(settings.max_response_bytes, settings.max_list_values)
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
                        "max_length": self.max_length(m),
                        "encoder_decoder": is_seq2seq(m)})  # the page then asks for a target
        return out

    def model(self, name: str | None) -> Model:
        if name is None:
            return self.default
        if name not in self.models:  # the request validation already allows only these names
            raise AttnscopeError(f"model {name!r} is not served here: use one of {', '.join(self.names)}")
        return self.models[name]

    def max_length(self, m: Model, asked: int | None = None) -> int:
        """A request's max_length: as asked, or when null the server's max_tokens or the model's positions, the
        smaller."""
        return asked if asked is not None else min(self.settings.max_tokens, m.max_positions)

    def model_lock(self, m: Model) -> threading.Lock:
        """Held while the model runs (attnscope.serve.generate): one forward pass at a time per model."""
        return self._locks[id(m)]

    def entry(self, req: TextRequest, stop: threading.Event, follow_up: bool = True) -> tuple[Model, Entry]:
        """The trace of this text, from the cache or from a forward pass (not started once `stop` is set).
        follow_up=False: no request about it is expected, and the cache keeps it only if asked for before."""
        m, key = self.key(req)
        hit = self.cache.get(key)
        if hit is not None:
            return m, hit
        with self._locks[id(m)]:  # the forward pass has the model to itself
            checkpoint(stop)  # its client may have left while it waited for the model
            pending = forward_pass(req.text, req.pair, model=m, max_length=key[3], truncate=req.truncate)
        checkpoint(stop)
        # the recompute and check read only what the forward pass left: the next text's forward pass runs meanwhile
        tr = pending.finish()[0]
        e = Entry(tr, tr.check().to_dict())  # a trace keeps only its errors, so the check is cheap to keep
        self.cache.put(key, e, follow_up)
        return m, e

    def key(self, req: TextRequest) -> tuple[Model, CacheKey]:
        m = self.model(req.model)
        return m, (m.name, req.text, req.pair, self.max_length(m, req.max_length), req.truncate)

    def trace_body(self, req: TraceRequest, stop: threading.Event) -> bytes:
        if req.target is not None or is_seq2seq(self.model(req.model)):  # three kinds of attention
            return seq2seq_body(self, req, stop)
        optional = tuple(s for s in DERIVED if s in req.sources)
        # the page's request for a long trace it asked for before: its answer is kept with the maps (the
        # trace itself may have left the cache: 4.5 GB for SmolLM2 at 2,048 tokens)
        plain = req.payload and not req.stages and not req.binary and req.maps != "inline"
        kept = self.maps.get(maps.trace_id(self.key(req)[1])) if plain else None
        if kept is not None and (req.maps, *optional) in kept.answers:  # "auto" is kept only where it went lazy
            return kept.answers[(req.maps, *optional)]
        if plain:
            self.check_fit(req, optional)  # before minutes of tracing: maps that cannot be kept are refused
            if self.streams(req, optional):
                return self.streamed_body(req, stop)
        _m, e = self.entry(req, stop, follow_up=req.payload)  # the page asks again about what it shows
        tr = e.trace
        lazy = req.maps == "lazy" or (req.maps == "auto" and maps.is_large(tr))
        try:
            arrays = {s: response_array(tr, s, req) for s in req.stages}
            payload_json = b"" if not req.payload else (
                self.lazy_payload(e, optional, self.key(req)[1]) if lazy else views_payload(e, optional))
        finally:
            self.cache.fit()  # the entry grew: derived arrays, a payload
        self.budget.validate(arrays, f"binary {req.precision}" if req.binary else req.encoding, len(payload_json))
        checkpoint(stop)
        body = answer_fields(tr, e.check)
        if req.binary:  # Accept: application/x-attnscope-arrays (attnscope.serve.binary)
            extra = {"payload": json.loads(payload_json)} if req.payload else {}
            return binary.encode(body | extra, {s: (a, ARRAY_AXES[s]) for s, a in arrays.items()}, req.precision)
        body["arrays"] = {s: encode_array(np.asarray(a), ARRAY_AXES[s], req.encoding) for s, a in arrays.items()}
        out = with_payload(to_json(body), payload_json) if req.payload else to_json(body)
        if plain and lazy:
            self.remember_lazy(req, tr, optional, out)
        return out

    def remember_lazy(self, req: TraceRequest, tr: Trace, optional: tuple[str, ...], out: bytes) -> None:
        """Keep the page's lazy answer with its maps; a large trace's answer is the same for "lazy" and "auto"."""
        modes = ("lazy", "auto") if maps.is_large(tr) else (req.maps,)
        self.maps.remember(maps.trace_id(self.key(req)[1]), [(m, *optional) for m in modes], out)

    def check_fit(self, req: TraceRequest, optional: tuple[str, ...]) -> None:
        """A long trace whose uint8 maps will not fit the map store is refused (422, with advice) before it is
        traced, unless it is cached already; a race with other traces still answers "stored": false."""
        m, key = self.key(req)
        if self.cache.peek(key):
            return
        n = self.token_count(req)
        if req.maps == "auto" and m.n_layers * m.n_heads * n * n <= maps.LAZY_FROM:
            return  # inline maps: the trace cache bounds them
        sizes = maps.map_bytes(m.n_layers, m.n_heads, n, ("weights", *optional))
        maps.validate_fit(sizes, self.maps.max_bytes, n, rows.x_bytes(m, n))

    def token_count(self, req: TextRequest) -> int:
        """How many tokens the request's text traces to (special tokens and its pair included)."""
        m, key = self.key(req)
        return int(encode(m.tokenizer, [req.text], [req.pair], key[3], req.truncate).inputs["input_ids"].shape[1])

    def streams(self, req: TraceRequest, optional: tuple[str, ...]) -> bool:
        """Whether the page's request for this trace is answered from a streamed trace (attnscope.tracing.streamed:
        each layer checked and quantized inside the forward pass, its float32 weights let go): its maps go lazily,
        it asks for no derived source (those read every layer's weights), the trace is not cached and the model
        is one attnscope recomputes."""
        m, key = self.key(req)
        if optional or self.cache.peek(key) or not streamed.can_stream(m):
            return False
        if req.maps == "lazy":
            return True
        n = self.token_count(req)
        return req.maps == "auto" and m.n_layers * m.n_heads * n * n > maps.LAZY_FROM  # maps.is_large's count

    def streamed_body(self, req: TraceRequest, stop: threading.Event) -> bytes:
        """trace_body for the page's lazy request, from a streamed trace: the same answer, byte for byte, as from
        the whole trace (tests/serve/test_serve_streamed.py), without holding every layer's float32 weights (SmolLM2
        at 2,048 tokens: 4.5 GB) or reading them again to check them. The trace itself is not cached: an exact map
        or a request for its stages traces the text again, as once a long trace has left the cache."""
        m, key = self.key(req)
        weights = maps.Compactor("weights", m.n_layers)

        def keep(layer: int, layer_weights: Any) -> None:  # streamed.WeightsSink: [head, query, key]
            checkpoint(stop)  # a client gone or a deadline passed: the forward pass ends here, between two layers
            weights.add(layer, layer_weights)

        with self._locks[id(m)]:  # the forward pass, with every layer's check, has the model to itself
            checkpoint(stop)
            st = streamed.streamed_trace(req.text, req.pair, m, key[3], req.truncate, keep)
        checkpoint(stop)
        tr = st.trace
        kept = maps.MapSet(maps.trace_id(key), key, {"weights": weights.source()}, words=maps.word_level(tr))
        kept.rows = rows.keep(tr, st.stages)
        payload_json = self.lazy_answer(tr, kept, (), st.stages)
        self.budget.validate({}, req.encoding, len(payload_json))
        checkpoint(stop)
        out = with_payload(to_json(answer_fields(tr, tr.check().to_dict()) | {"arrays": {}}), payload_json)
        self.remember_lazy(req, tr, (), out)
        return out

    def lazy_payload(self, e: Entry, optional: tuple[str, ...], key: CacheKey) -> bytes:
        """The views' payload without maps (attnscope.serve.maps), its maps kept as uint8 in self.maps."""
        if ("lazy", *optional) not in e.payloads:
            for name in optional:
                stage_array(e.trace, name)
            names = [n for n in payload_sources(e.trace) if n not in DERIVED or n in optional]
            kept = maps.compact(e.trace, names, key)
            kept.rows = rows.keep(e.trace)  # x of every layer: one layer's answers without the exact trace
            e.payloads[("lazy", *optional)] = self.lazy_answer(e.trace, kept, optional, tuple(e.trace.arrays))
        return e.payloads[("lazy", *optional)]

    def lazy_answer(self, trace: Trace, kept: maps.MapSet, optional: tuple[str, ...],
                    stages: tuple[str, ...]) -> bytes:
        """The lazy payload's JSON for a trace whose maps are `kept` (stored here, with its rows where they fit).
        stages: the arrays the trace had (a streamed trace's arrays hold only what the rows keep)."""
        if kept.rows is not None and kept.nbytes > self.maps.max_bytes:
            kept.rows = None  # the maps alone fit: those answers trace the text again
        # the payload's own fields from stand-ins (maps 1 x 1, then replaced): no quantizing twice, no layout
        small = maps.stand_ins(trace, list(kept.sources), optional, stages)
        p = payload(dataclasses.replace(trace, arrays=small), neuron="none")
        p["neuron"]["available"] = all(s in stages for s in NEURON_STAGES)
        p["sources"] = maps.lazy_sources(kept, p)
        p["maps"] = {"trace": kept.id, "url": f"/api/trace/{kept.id}/map", "stored": self.maps.put(kept)}
        wordmaps.add_words(p, kept, trace)  # word_level, and the words' own lazy payload
        return to_json(p)

    def exact_map(self, req: tuple[maps.MapSet, maps.MapQuery], stop: threading.Event) -> bytes:
        """float32 or float16 of a stored trace's map from its exact trace (cached, else traced again)."""
        kept, q = req
        _m, e = self.entry(maps.Retrace.of(kept.key), stop)
        try:
            return maps.exact_body(kept, q, e.trace, stage_array(e.trace, q.source))
        finally:
            self.cache.fit()

    def layer_trace(self, req: TextRequest, layer: int, stop: threading.Event,
                    head: int | None = None) -> tuple[Model, Trace]:
        """A trace to answer about one layer (or one head of it) with: the exact trace when cached, else a long
        trace's layer (head) recomputed from its kept x (attnscope.serve.rows: the same numbers, a second or less
        instead of a forward pass of the whole text), else a forward pass."""
        m, key = self.key(req)
        if not self.cache.peek(key):
            kept = self.maps.get(maps.trace_id(key))
            if kept is not None and kept.rows is not None:
                checkpoint(stop)
                tr = None if head is None else self.heads.one_head(kept.id, kept.rows, m, layer, head)
                tr = rows.one_layer(kept.rows, m, layer) if tr is None else tr
                if tr is not None:
                    return m, tr
        m, e = self.entry(req, stop)
        return m, captured(e.trace)

    def explain_body(self, req: ExplainRequest, stop: threading.Event) -> bytes:
        m, tr = self.layer_trace(req, req.layer, stop, head=req.head)
        w = walkthrough(tr, req.layer, req.head, req.token, model=m)
        if req.arrays == "shown":  # the page's: at most 12 rows, 64 columns (a key stage: every key) an array
            return to_json(walkthrough_shown_json(w))
        values = sum(int(np.asarray(a).size) for s in w.steps for a in s.arrays.values())
        size = values * _LIST_BYTES  # every array as JSON lists: sized before the body is built
        if size > self.budget.max_bytes:  # --max-response; --max-list bounds what a client chooses as lists
            raise AttnscopeError(f"the explanation would hold {values} numbers (about {size / 2**20:.0f} MiB), over "
                                 f"the server's limit of {self.budget.max_bytes / 2**20:.0f} MiB: give a token to "
                                 "follow one query row, or a shorter text", parameter="token")
        return to_json(walkthrough_json(w))

    def neuron_body(self, req: NeuronRequest, stop: threading.Event) -> bytes:
        _m, tr = self.layer_trace(req, req.layer, stop, head=req.head)
        if req.binary:  # Accept: application/x-attnscope-arrays: raw float32, nothing to encode or decode
            return rows.neuron_binary(tr, req.layer, req.head, req.query)
        compress = tr.n_tokens * tr.n_keys <= _NEURON_ZLIB_UP_TO
        return to_json(neuron_block(tr, req.layer, req.head, compress=compress, query=req.query))


def answer_fields(tr: Trace, check: dict[str, Any]) -> dict[str, Any]:
    """POST /api/trace's fields before its arrays and payload: the text, its tokens and the check."""
    return {"model": tr.model, "text": tr.text, "pair": tr.pair, "truncated": tr.truncated,
            "tokens": [t.to_dict() for t in tr.tokens], "check": check}


def with_payload(body: bytes, payload_json: bytes) -> bytes:
    """A JSON object's bytes with the payload's JSON added as its last field, not parsed again."""
    return body[:-1] + b',"payload":' + payload_json + b"}"


def captured(tr: Trace) -> Trace:
    """The trace with its captured stages only: the walkthrough reads each array by layer, and derived
    arrays (flow is [query, key]) have no layer axis to read."""
    return dataclasses.replace(tr, arrays={k: v for k, v in tr.arrays.items() if k not in DERIVED})


def load_models(specs: tuple[str, ...]) -> dict[str, Model]:
    """Load every served model up front, so a bad name fails at start and not on a request."""
    out: dict[str, Model] = {}
    for spec in specs or (None,):
        m = load_model(spec)
        out.setdefault(m.name, m)
        if spec is not None:
            out.setdefault(spec, m)
    return out


def response_array(tr: Trace, stage: str, req: TraceRequest) -> np.ndarray | binary.Parts:
    """A stage for a response; uint8 maps still in the forward pass's batch are quantized where they are
    (binary.Parts), which spares laying them out (8 ms of 20 for MiniLM's weights at 256 tokens)."""
    quantized = req.binary and req.precision == "uint8" and stage in SOURCES
    if quantized and stage in getattr(tr.arrays, "pending", list)():
        return binary.Parts(tr.arrays.layer_parts(stage))  # type: ignore[attr-defined]
    return stage_array(tr, stage)


@dataclass(frozen=True)
class Budget:
    """How large a response may be, checked before it is built (an array in JSON lists is ~4x base64)."""

    max_bytes: int
    max_list_values: int

    def validate(self, arrays: Mapping[str, np.ndarray | binary.Parts], encoding: str, extra: int = 0) -> None:
        values = sum(int(a.size) for a in arrays.values())
        if encoding == "list" and values > self.max_list_values:
            raise AttnscopeError(f"encoding 'list' is limited to {self.max_list_values} numbers per response and "
                                 f"these arrays hold {values}: use encoding 'base64', fewer stages or a smaller "
                                 "max_length", parameter="encoding")
        per_value = {"list": _LIST_BYTES, "binary float32": 4, "binary float16": 2, "binary uint8": 2}  # uint8: maps 1
        size = extra + values * per_value.get(encoding, _BASE64_BYTES)
        if size > self.max_bytes:
            raise AttnscopeError(f"the response would be about {size / 2**20:.0f} MiB, over the server's limit of "
                                 f"{self.max_bytes / 2**20:.0f} MiB: ask for fewer stages or a smaller max_length")


def views_payload(e: Entry, optional: tuple[str, ...]) -> bytes:
    """The views' payload (attnscope.views.payload) as JSON: raw weights plus the `optional` sources, and
    their word-level payload when some word has several pieces (views.words).

    Built once per entry and choice, so switching views, layers and heads costs no recompute;
    kept as bytes, so the cache counts exactly what it holds.
    """
    if optional not in e.payloads:
        tr = e.trace
        for name in optional:
            stage_array(tr, name)
        kept = {k: v for k, v in tr.arrays.items() if k not in DERIVED or k in optional}
        shown = dataclasses.replace(tr, arrays=kept)
        data = payload(shown)
        words = maps.word_level(shown)  # None when every word is one token
        if words is not None:  # the page's words button, as `attnscope view --word-level`
            # level and word_of: the page keeps the selection across the button and explains a word's first token
            data["words"] = payload(word_trace(shown), neuron="none") | {"level": "words",
                                                                          "word_of": words.unit.tolist()}
        e.payloads[optional] = to_json(data)
    return e.payloads[optional]
