"""Word level for long traces in the web app: word maps of a lazily sent trace, computed on request.

Words are views.words' (to a word, the sum over its pieces as keys; from a word, the mean over its pieces as
queries; special tokens alone). A lazy trace's word maps are never stored: `GET /api/trace/ID/map?level=words`
merges one head or one layer per request.
- uint8 (what the page draws) comes from the stored uint8 codes, with no forward pass: integer sums of the
  codes over each word's pieces, times scale / 255, over the query word's pieces, quantized again with one
  scale per map. Approximate: |value - exact| <= (p * s + s_w) / 510 per cell, with p the key word's pieces,
  s the token map's scale and s_w the word map's (each token code is within s / 510, a word sums p of them;
  quantizing again adds half a step of the word map).
- float32 and float16 come from the exact trace (serve.maps.exact_body): views.words.merge of the map, the
  numbers of views.words.word_trace.
The lazy payload says whether words differ from tokens (`word_level`) and, up to WORDS_UP_FRONT codes, carries
a second lazy payload for the words (`words`: word tokens, each word map's scale and 64 x 64 overview, from
the stored codes), which the page's words button switches to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from attnscope.serve import binary
from attnscope.serve.maps import OVERVIEW, MapQuery, MapSet, WordLevel, map_header
from attnscope.serve.quantize import overview
from attnscope.views.payload import encode_bytes
from attnscope.views.words import word_tokens

if TYPE_CHECKING:
    from attnscope.records.trace import Trace

# the words payload is built with the lazy one up to this many stored codes (MiniLM at 512 tokens holds 2^24.2:
# ~0.5 s); above it the map endpoint still serves word maps, and the page shows the words button disabled
WORDS_UP_FRONT = 2**25


def from_codes(codes: np.ndarray, scales: np.ndarray, words: WordLevel) -> np.ndarray:
    """[head, query, key] uint8 codes and [head] scales -> [head, word, word] float64 word values."""
    order = np.concatenate([np.asarray(g) for g in words.groups])  # tokens word by word
    contiguous = bool((order == np.arange(len(order))).all())  # pieces of a word are adjacent (as a rule)
    starts = np.concatenate([[0], np.cumsum(words.pieces[:-1])]).astype(np.int64)  # [word] first piece in order
    out = np.empty((codes.shape[0], words.n, words.n), dtype=np.float64)
    for h in range(codes.shape[0]):  # one map at a time: float32 scratch of one map
        c = codes[h].astype(np.float32) if contiguous else codes[h][order][:, order].astype(np.float32)
        # sums of integer codes over pieces: exact in float32 while 255 x pieces_q x pieces_k < 2^24
        rows = np.add.reduceat(c, starts, axis=0)  # [word, key]
        out[h] = np.add.reduceat(rows, starts, axis=1)  # [word, word]
    out *= (scales / 255.0)[:, None, None]  # code sums -> value sums (to a word: the sum over its key pieces)
    out /= words.pieces[None, :, None]  # from a word: the mean over its query pieces
    return out


def stored_body(maps: MapSet, q: MapQuery) -> bytes:
    """Word maps from the stored codes as uint8 (one scale each): [word, word] for one head, else [head, ...]."""
    s, words = maps.sources[q.source], maps.words
    assert words is not None  # parse_query refuses level=words without word pieces
    heads = [q.head or 0] if q.head is not None or not s.per_head else list(range(s.codes.shape[1]))
    codes, scales = _quantized(s.codes[q.layer or 0], s.scales[q.layer or 0], words, heads)
    at = codes[0] if len(heads) == 1 and (q.head is not None or not s.per_head) else codes
    axes = ("query", "key") if at.ndim == 2 else ("head", "query", "key")
    kept = scales[:1] if at.ndim == 2 else scales
    spec = {"axes": list(axes), "shape": list(at.shape), "dtype": "uint8", "scales": [float(x) for x in kept]}
    return binary.encode_packed(map_header(maps, q, at.shape), {q.source: (at.data.cast("B"), spec)})


def _quantized(codes: np.ndarray, scales: np.ndarray, words: WordLevel,
               heads: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """One layer's [head, query, key] codes -> the heads' word maps as uint8 [head, word, word] and scales [head],
    one map at a time (a float64 scratch of one word map, not of the layer)."""
    parts = [binary.quantize_maps(from_codes(codes[h:h + 1], scales[h:h + 1], words)) for h in heads]
    return np.concatenate([c for c, _ in parts]), np.concatenate([sc for _, sc in parts])


def summary(maps: MapSet, words: WordLevel) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per source: each word map's scale [layer, head] and its max-pooled overview [layer, head, s_q, s_k]."""
    out = {}
    for name, s in maps.sources.items():
        heads = list(range(s.codes.shape[1]))
        parts = [_quantized(s.codes[i], s.scales[i], words, heads) for i in range(len(s.codes))]
        out[name] = (np.stack([sc for _, sc in parts]), np.stack([overview(c, OVERVIEW) for c, _ in parts]))
    return out


def add_words(p: dict[str, Any], maps: MapSet, trace: Trace) -> None:
    """The lazy payload's `word_level` (and `words`, the words' own lazy payload, when not too large)."""
    words = maps.words
    if words is None:
        p["word_level"] = {"available": False, "toggle": False, "words": [], "word_of": [],
                           "reason": "every word is one token: the words are the tokens"}
        return
    tokens = word_tokens(trace, words.groups)
    codes = sum(s.codes.size for s in maps.sources.values())
    toggle = codes <= WORDS_UP_FRONT
    p["word_level"] = {"available": True, "toggle": toggle, "words": [t.text for t in tokens],
                       "word_of": [int(u) for u in words.unit], "reason": None if toggle else
                       f"the trace holds {codes} map values, over the {WORDS_UP_FRONT} up to which the page gets word "
                       "overviews: GET the map with level=words"}
    if toggle:
        p["words"] = _words_payload(p, maps, words, tokens)


def _words_payload(p: dict[str, Any], maps: MapSet, words: WordLevel, tokens: list[Any]) -> dict[str, Any]:
    parts = summary(maps, words)
    sources = []
    for spec in p["sources"]:
        scales, view = parts[spec["name"]]
        suffix, data = encode_bytes(view.tobytes(), True)
        sources.append(spec | {"shape": [*spec["shape"][:2], words.n, words.n],
                               "scales": [float(x) for x in scales.ravel()],
                               "overview": {"shape": list(view.shape[-2:]), "encoding": "u8" + suffix, "data": data}})
    rest = {k: v for k, v in p.items() if k != "word_level"}
    return rest | {"tokens": [t.text for t in tokens], "segments": [int(t.segment) for t in tokens],
                   "special": [bool(t.special) for t in tokens], "sources": sources, "level": "words",
                   "word_of": p["word_level"]["word_of"], "maps": p["maps"] | {"level": "words"},
                   "neuron": {"blocks": [], "complete": False, "available": False},
                   "initial": p["initial"] | {"query": None}}
