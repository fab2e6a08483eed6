"""Word-level views: word pieces merged into words, as `attnscope stats --word-level` merges them.

To a word, attention is the sum over its pieces (as a key); from a word, the mean over its pieces
(as a query): U = mean_from @ A @ sum_to, computed by the statistics' own `UnitMaps.apply` (Clark et
al. 2019). Special tokens stay units of their own. Each row of a word-level weight map still sums
to 1. The word trace keeps the token-level trace's check (its verification is of the real tokens).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from attnscope.stages import ARRAY_AXES
from attnscope.tokens import Token
from attnscope.views.payload import source_names

if TYPE_CHECKING:
    from attnscope.records.trace import Trace


def word_groups(trace: Trace) -> list[list[int]]:
    """Token indices of each word, in order of first appearance (specials and word-less tokens alone)."""
    groups: dict[tuple[str, int], list[int]] = {}
    for t in trace.tokens:
        key = ("token", t.index) if t.word is None or t.special else ("word", t.word)
        groups.setdefault(key, []).append(t.index)
    return list(groups.values())


def _word_token(trace: Trace, unit: int, pieces: list[int]) -> Token:
    first, last = trace.tokens[pieces[0]], trace.tokens[pieces[-1]]
    text = trace.text if first.segment == 0 else (trace.pair or "")
    alone = len(pieces) == 1 or first.start is None or last.end is None
    # a span of the text reads as it is; a piece alone keeps the tokenizer's decoding of it
    shown, decoded = (first.text, first.decoded) if alone else (text[first.start:last.end], None)
    return Token(index=unit, text=shown, id=first.id, start=first.start, end=last.end, special=first.special,
                 word=first.word, segment=first.segment, decoded=decoded)


def merge(maps: np.ndarray, groups: list[list[int]]) -> np.ndarray:
    """[..., query, key] token maps -> [..., word, word], through stats' UnitMaps.apply (float32)."""
    import torch

    from attnscope.stats.batching import UnitMaps

    n, u = maps.shape[-1], len(groups)
    mean_from = torch.zeros((1, u, n), dtype=torch.float32)  # [batch, unit, token]
    sum_to = torch.zeros((1, n, u), dtype=torch.float32)  # [batch, token, unit]
    for unit, pieces in enumerate(groups):
        mean_from[0, unit, pieces] = 1.0 / len(pieces)
        sum_to[0, pieces, unit] = 1.0
    lead = maps.shape[:-2]
    flat = torch.from_numpy(np.ascontiguousarray(maps, dtype=np.float32)).reshape(1, -1, n, n)  # [1, maps, q, k]
    out = UnitMaps(mean_from, sum_to, None, [groups]).apply(flat)  # [1, maps, word, word]
    return out.reshape(*lead, u, u).numpy()


def word_tokens(trace: Trace, groups: list[list[int]]) -> list[Token]:
    """One Token per word (its text the span of its pieces), indexed by word."""
    return [_word_token(trace, u, pieces) for u, pieces in enumerate(groups)]


def word_trace(trace: Trace) -> Trace:
    """The trace with words for tokens and every drawable [query, key] source merged (no neuron data)."""
    groups = word_groups(trace)
    arrays = {name: merge(trace.arrays[name], groups) for name in source_names(trace)
              if ARRAY_AXES[name][-2:] == ("query", "key")}
    return dataclasses.replace(trace, tokens=word_tokens(trace, groups), arrays=arrays)
