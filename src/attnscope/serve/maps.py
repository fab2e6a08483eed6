"""Long traces in the web app: the page gets tokens and summaries first, each map when it is shown.

`POST /api/trace` with `"maps": "lazy"` (or "auto" on a large trace) answers with a views payload
whose sources carry no maps, only what the page needs at once: per map its scale (the max) and a
max-pooled overview of at most OVERVIEW x OVERVIEW uint8 codes (the model view's thumbnails), and
`"maps": {"trace": ID, "url": "/api/trace/ID/map"}`. The server keeps the trace's drawable maps as
uint8 codes in a MapStore (a quarter of float32; SmolLM2 at 2,048 tokens: 1.1 GB instead of 4.5 GB),
and `GET /api/trace/ID/map?source=&layer=&head=&precision=` sends one map (or, without head, every
head of a layer) in the binary form of attnscope.serve.binary. uint8 comes from the store as quantized
once (the codes the inline payload would carry); float16 and float32 come from the exact trace (the
trace cache, or a new forward pass of the same text when it was evicted). `level=words` sends word maps
(pieces merged into words, views.words; attnscope.serve.wordmaps), computed on request, never stored.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from attnscope.errors import AttnscopeError, validate_index
from attnscope.numbers import is_count
from attnscope.serve import binary, quantize
from attnscope.stages import ARRAY_AXES, DERIVED, SOURCE_LABELS
from attnscope.views.payload import encode_bytes
from attnscope.views.words import merge, word_groups

if TYPE_CHECKING:
    from attnscope.records.trace import Trace
    from attnscope.serve.cache import CacheKey
    from attnscope.serve.rows import Rows

OVERVIEW = 64  # the overview's side at most, in cells: each cell the max of its block of codes
LAZY_FROM = 2**24  # "auto": maps travel lazily when a source holds more codes than this (16 MiB of uint8)
MODES = ("inline", "lazy", "auto")
LEVELS = ("tokens", "words")
QUERY = ("source", "layer", "head", "precision", "level")  # GET /api/trace/ID/map's parameters (serve.openapi too)


def trace_id(key: CacheKey) -> str:
    """A stable id for one traced text (same text, model and length: same id, across restarts)."""
    return hashlib.sha256(repr(key).encode("utf-8")).hexdigest()[:16]


@dataclass
class Source:
    """One drawable array as uint8: codes [layer, head, query, key] (length-1 axes where it has none)."""

    name: str
    codes: np.ndarray  # [layer, head, query, key] uint8
    scales: np.ndarray  # [layer, head] float64, the max of each map
    per_layer: bool
    per_head: bool
    view: np.ndarray  # quantize.overview(codes, OVERVIEW) [layer, head, s_q, s_k], formed with the codes


@dataclass(frozen=True)
class WordLevel:
    """A trace's words as views.words groups them: the token indices of each word, and the word of each token."""

    groups: list[list[int]]
    unit: np.ndarray  # [token] int64: the word each token belongs to
    pieces: np.ndarray  # [word] float64: how many tokens each word has

    @property
    def n(self) -> int:
        return len(self.groups)


def word_level(trace: Trace) -> WordLevel | None:
    """The trace's words, or None when every word is a single token (the word level would equal the tokens)."""
    groups = word_groups(trace)
    if len(groups) == len(trace.tokens):
        return None
    unit = np.empty(len(trace.tokens), dtype=np.int64)
    for u, pieces in enumerate(groups):
        unit[pieces] = u
    return WordLevel(groups, unit, np.array([len(g) for g in groups], dtype=np.float64))


@dataclass
class MapSet:
    """A trace's drawable maps, compact, and how to trace it again for exact numbers."""

    id: str
    key: CacheKey
    sources: dict[str, Source]
    answers: dict[tuple[str, ...], bytes] = field(default_factory=dict)  # POST /api/trace's, by mode and sources
    words: WordLevel | None = None  # None: every word is one token
    rows: Rows | None = None  # x of every layer: /api/neuron and /api/explain recompute one layer (serve.rows)

    @property
    def nbytes(self) -> int:
        answers = {id(a): a for a in self.answers.values()}.values()  # one answer, several keys
        views = sum(s.view.nbytes for s in self.sources.values())
        return views + sum(s.codes.nbytes + s.scales.nbytes for s in self.sources.values()) + \
            sum(len(a) for a in answers) + (0 if self.rows is None else self.rows.nbytes)


def is_large(trace: Trace) -> bool:
    """Would the raw weights as uint8 exceed LAZY_FROM codes (the point where "auto" goes lazy)? Read from the
    trace's description where it has one: trace.n_layers would lay the weights out of the batch (4.5 GB copied for
    SmolLM2 at 2,048 tokens) to read their shape."""
    layers, heads = trace.model.get("layers"), trace.model.get("heads")
    if not (isinstance(layers, int) and isinstance(heads, int)):
        layers, heads = trace.n_layers, trace.n_heads
    return layers * heads * len(trace.tokens) ** 2 > LAZY_FROM


def map_bytes(layers: int, heads: int, tokens: int, names: tuple[str, ...]) -> dict[str, int]:
    """The uint8 bytes compact() will keep per source, before tracing: [layer, head, query, key] for weights and
    norm_head, [layer, query, key] for rollout and norm_layer, [query, key] for flow (one byte a code)."""
    per_map = tokens * tokens
    count = {"weights": layers * heads, "norm_head": layers * heads, "rollout": layers, "norm_layer": layers,
             "flow": 1}
    return {name: count.get(name, layers * heads) * per_map for name in names}


def validate_fit(sizes: dict[str, int], limit: int, tokens: int, rows: int = 0) -> None:
    """Refuse (422) a long trace whose maps cannot stay in the map store (--cache-size) before it is traced,
    saying which sources (the page's boxes) to leave out, or the --cache-size that would hold them and the
    `rows` bytes kept beside them when they fit (x of every layer, attnscope.serve.rows)."""
    total = sum(sizes.values())
    if total <= limit:
        return
    mib = {name: -(-size // 2**20) for name, size in sizes.items()}
    parts = ", ".join(f"{n} {m} MiB" for n, m in mib.items())
    optional = sorted((n for n in sizes if n != "weights"), key=lambda n: -sizes[n])  # largest first
    drop, left = [], total
    for name in optional:
        if left <= limit:
            break
        drop.append(name)
        left -= sizes[name]
    untick = " and ".join(repr(SOURCE_LABELS.get(n, n)) for n in drop)
    leave = f"leave out {' and '.join(repr(n) for n in drop)} (sources; on the page, untick {untick})"
    if drop and left <= limit:
        advice = f"{leave}, or start the server with --cache-size {_mib(total + rows) + 1} or more"
    elif drop:  # the weights alone do not fit either
        advice = (f"{leave} and start the server with --cache-size {_mib(sizes['weights'] + rows) + 1} or more "
                  f"({_mib(total + rows) + 1} to keep them)")
    else:
        advice = f"start the server with --cache-size {_mib(total + rows) + 1} or more"
    raise AttnscopeError(
        f"this {tokens}-token trace's maps do not fit the server's map cache: they would take {_mib(total)} MiB as "
        f"uint8 ({parts}), over --cache-size of {limit // 2**20} MiB: {advice}, or trace fewer tokens (max_length); "
        f"the sizes to start with count {_mib(rows)} MiB kept for the Neuron tab's and the explanations' recompute",
        parameter="sources")


def _mib(size: int) -> int:
    return -(-size // 2**20)


def compact(trace: Trace, names: list[str], key: CacheKey) -> MapSet:
    """Quantize each source one layer at a time (attnscope.serve.quantize), reading a stage still in the forward
    pass's batch where it is (no [layer, head, query, key] copy), and form each layer's overview meanwhile."""
    out: dict[str, Source] = {}
    for name in names:
        per_layer = "layer" in ARRAY_AXES[name]
        layers = _layers(trace, name) if per_layer else [trace.arrays[name]]
        kept = Compactor(name, len(layers))
        for i, m in enumerate(layers):
            kept.add(i, m)
        out[name] = kept.source()
    return MapSet(trace_id(key), key, out, words=word_level(trace))


class Compactor:
    """One source's Source built a layer at a time, in any order: each layer's maps quantized into the codes
    (attnscope.serve.quantize, on the server's torch threads) and pooled into its overview as it comes; what a
    streamed trace hands on inside the forward pass (attnscope.tracing.streamed) and what compact() runs."""

    def __init__(self, name: str, n_layers: int) -> None:
        import torch  # the server's threads (--threads) share the maps of a layer

        axes = ARRAY_AXES[name]
        self.name, self.n_layers, self.threads = name, n_layers, torch.get_num_threads()
        self.per_layer, self.per_head = "layer" in axes, "head" in axes
        self.codes: np.ndarray | None = None  # [layer, head, query, key], made with the first layer
        self.scales: list[np.ndarray | None] = [None] * n_layers  # [head] each: the max of each map
        self.views: list[np.ndarray | None] = [None] * n_layers  # [head, s_q, s_k] each

    def add(self, layer: int, maps: Any) -> None:
        """One layer's maps: [head, query, key] (or [query, key] where the source has no head), numpy or a CPU
        tensor, read where it is."""
        m = np.asarray(maps) if self.per_head else np.asarray(maps)[None]  # [head, query, key]
        if self.codes is None:
            self.codes = np.empty((self.n_layers, *m.shape), dtype=np.uint8)
        self.scales[layer] = quantize.quantize_layer(self.name, layer, m, self.threads, self.codes[layer])[1]
        self.views[layer] = quantize.overview(self.codes[layer], OVERVIEW)

    def source(self) -> Source:
        missing = [i for i, s in enumerate(self.scales) if s is None]
        if self.codes is None or missing:
            raise RuntimeError(f"{self.name}: layers {missing} were never added")
        return Source(self.name, self.codes, np.stack(self.scales), self.per_layer, self.per_head,  # type: ignore[arg-type]
                      np.stack(self.views))  # type: ignore[arg-type]


def stand_ins(trace: Trace, names: list[str], optional: tuple[str, ...],
              stages: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
    """The arrays views.payload (neuron="none") reads for a lazy payload's own fields, none laid out of the batch:
    each of `names` (the maps, sent apart) as [layer, head, 1, 1] zeros, every other stage (derived ones only when
    in optional) with the sizes the trace's description gives and no tokens, as the payload only asks whether it
    is there (the layout would copy 4.5 GB of weights and form as much of scores for SmolLM2 at 2,048 tokens).
    stages: the stages the trace had, where its arrays hold fewer (a streamed trace, attnscope.tracing.streamed)."""
    sizes = {"layer": trace.model.get("layers"), "head": trace.model.get("heads"),
             "kv_head": trace.model.get("kv_heads") or trace.model.get("heads"),
             "d_head": trace.model.get("d_head"), "d_model": trace.model.get("d_model")}
    out = {}
    for k in dict.fromkeys([*(trace.arrays if stages is None else stages), *names]):
        if k in DERIVED and k not in optional:
            continue
        found = [sizes.get(a, 0) for a in ARRAY_AXES.get(k, ())]
        dims = [d for d in found if isinstance(d, int)]
        if (not dims or len(dims) < len(found)) and k in trace.arrays:
            out[k] = trace.arrays[k]  # unknown axes: as it is
        elif k in names:
            out[k] = np.zeros((*dims[:-2], 1, 1), np.float32)
        else:
            out[k] = np.zeros(dims, np.float32)  # token axes 0: empty
    return out


def _layers(trace: Trace, name: str) -> list[np.ndarray]:
    """A [layer, ...] stage as one array per layer: views into the forward pass's batch while it is there."""
    arrays = trace.arrays
    if name in getattr(arrays, "pending", list)():
        return list(arrays.layer_parts(name))  # type: ignore[attr-defined]
    return list(arrays[name])


def lazy_sources(maps: MapSet, payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The payload's sources without their maps: scales, an overview each, and where to fetch the rest."""
    out = []
    for s in maps.sources.values():
        suffix, data = encode_bytes(s.view.tobytes(), True)  # the overview [layer, head, s_q, s_k]
        out.append({
            "name": s.name, "label": SOURCE_LABELS.get(s.name, s.name.replace("_", " ")),
            "axes": list(ARRAY_AXES[s.name]), "shape": list(s.codes.shape),
            "layers": payload["layers"] if s.per_layer else [], "heads": payload["heads"] if s.per_head else [],
            "range": "unit" if s.name == "weights" else "max", "scales": [float(x) for x in s.scales.ravel()],
            "encoding": "lazy", "data": None,
            "overview": {"shape": list(s.view.shape[-2:]), "encoding": "u8" + suffix, "data": data},
        })
    return out


@dataclass(frozen=True)
class MapQuery:
    """What `GET /api/trace/ID/map` asks for: a source, a layer, one head or all (None), a precision, a level."""

    source: str
    layer: int | None
    head: int | None
    precision: str
    level: str = "tokens"


def parse_query(params: dict[str, str], maps: MapSet) -> MapQuery:
    """The query string, validated against this trace (AttnscopeError: the server answers 422)."""
    unknown = sorted(set(params) - set(QUERY))
    if unknown:
        raise AttnscopeError(f"unknown parameter {unknown[0]!r}: use {', '.join(QUERY[:-1])} and {QUERY[-1]}")
    source = params.get("source", "weights")
    if source not in maps.sources:
        raise AttnscopeError(f"source {source!r} is not in this trace: it has {', '.join(maps.sources)}")
    precision = params.get("precision", "uint8")
    if precision not in binary.PRECISIONS:
        raise AttnscopeError(f"precision {precision!r} is not known: use one of {', '.join(binary.PRECISIONS)}")
    s = maps.sources[source]
    for name, has in (("layer", s.per_layer), ("head", s.per_head)):
        if name in params and not has:
            raise AttnscopeError(f"source {source!r} has no {name}s: leave out parameter {name!r}")
    layer = _index(params, "layer", s.codes.shape[0]) if s.per_layer else None
    head = _index(params, "head", s.codes.shape[1]) if s.per_head and "head" in params else None
    if s.per_layer and layer is None:
        raise AttnscopeError(f"parameter 'layer' is required for source {source!r} (0-indexed)")
    return MapQuery(source, layer, head, precision, _level(params, maps))


def _level(params: dict[str, str], maps: MapSet) -> str:
    level = params.get("level", "tokens")
    if level not in LEVELS:
        raise AttnscopeError(f"level {level[:20]!r} is not known: use tokens or words")
    if level == "words" and maps.words is None:
        raise AttnscopeError("this trace has no word pieces (every word is one token): its words are its tokens; "
                             "use level=tokens")
    return level


def _index(params: dict[str, str], name: str, count: int) -> int | None:
    text = params.get(name)
    if text is None:
        return None
    if not is_count(text) or len(text) > 9:
        raise AttnscopeError(f"parameter {name!r} must be a whole number from 0 to {count - 1}, got {text[:20]!r}")
    validate_index(name, int(text), count, "this trace")
    return int(text)


def map_header(maps: MapSet, q: MapQuery, shape: tuple[int, ...]) -> dict[str, Any]:
    """The binary body's header fields of one map request (n_query, n_key: words at level words)."""
    return {"trace": maps.id, "source": q.source, "layer": q.layer, "head": q.head, "level": q.level,
            "n_query": int(shape[-2]), "n_key": int(shape[-1])}


def stored_body(maps: MapSet, q: MapQuery) -> bytes:
    """The uint8 codes as stored (no new quantization): [query, key] for one head, else [head, query, key]."""
    s = maps.sources[q.source]
    at = s.codes[q.layer or 0]  # [head, query, key], C-contiguous: sent as a view
    scales = s.scales[q.layer or 0]  # [head]
    if q.head is not None or not s.per_head:
        at, scales = at[q.head or 0], scales[q.head or 0:(q.head or 0) + 1]
    axes = ("query", "key") if at.ndim == 2 else ("head", "query", "key")
    spec = {"axes": list(axes), "shape": list(at.shape), "dtype": "uint8", "scales": [float(x) for x in scales]}
    return binary.encode_packed(map_header(maps, q, at.shape), {q.source: (at.data.cast("B"), spec)})


def exact_body(maps: MapSet, q: MapQuery, trace: Trace, array: np.ndarray) -> bytes:
    """float32 (bit for bit) or float16 from the exact trace; the same slice as stored_body. Words: views.words'
    merge of that slice (the numbers of views.words.word_trace)."""
    s = maps.sources[q.source]
    at = array if s.per_layer else array[None]
    at = at[q.layer or 0] if s.per_head else at[q.layer or 0][None]  # [head, query, key]
    if q.head is not None or not s.per_head:
        at = at[q.head or 0]
    if q.level == "words" and maps.words is not None:
        at = merge(at, maps.words.groups)  # [(head,) word, word] float32
    axes = ("query", "key") if at.ndim == 2 else ("head", "query", "key")
    body = map_header(maps, q, at.shape) | {"check_ok": trace.check().ok}
    return binary.encode(body, {q.source: (at, axes)}, q.precision)


class MapStore:
    """Thread-safe LRU of MapSets by trace id, bounded in entries and bytes like the trace cache."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, MapSet] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, id: str) -> MapSet | None:
        with self._lock:
            found = self._items.get(id)
            if found is not None:
                self._items.move_to_end(id)
            return found

    def put(self, maps: MapSet) -> bool:
        """Keep it (evicting the oldest); False when it alone is over the byte cap (not kept)."""
        with self._lock:
            if maps.nbytes > self.max_bytes or self.max_entries == 0:
                return False
            self._items[maps.id] = maps
            self._items.move_to_end(maps.id)
            total = sum(m.nbytes for m in self._items.values())
            while len(self._items) > self.max_entries or total > self.max_bytes:
                _, old = self._items.popitem(last=False)
                total -= old.nbytes
            return True

    def remember(self, id: str, requests: list[tuple[str, ...]], answer: bytes) -> None:
        """Keep the page's answer for this trace (JSON, no arrays), so asking again costs no forward pass."""
        with self._lock:
            if id in self._items:
                self._items[id].answers.update(dict.fromkeys(requests, answer))

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"entries": len(self._items), "bytes": sum(m.nbytes for m in self._items.values())}



@dataclass(frozen=True)
class Retrace:
    """The text request a MapSet was traced from (a TextRequest), to trace it again for exact numbers."""

    model: str | None
    text: str
    pair: str | None
    max_length: int | None
    truncate: bool

    @classmethod
    def of(cls, key: CacheKey) -> Retrace:
        return cls(*key)


_BYTES = {"uint8": 1, "float16": 2, "float32": 4}


def validate_size(maps: MapSet, q: MapQuery, limit: int) -> None:
    """Refuse (422) a response over the server's limit before building it: ask for one head."""
    codes = maps.sources[q.source].codes
    count = 1 if q.head is not None or not maps.sources[q.source].per_head else codes.shape[1]
    n = maps.words.n if q.level == "words" and maps.words is not None else codes.shape[-1]  # [query, key] square
    size = count * n * n * _BYTES[q.precision]
    if size > limit:
        raise AttnscopeError(f"the map would be {size / 2**20:.0f} MiB, over the server's limit of "
                             f"{limit / 2**20:.0f} MiB: ask for one head (head=) or precision uint8")
