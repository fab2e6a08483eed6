"""Dependency syntax in attention heads (Clark et al. 2019, section 4.2 and Table 1).

For each head and each gold relation: how often the word a dependent attends to most
(excluding itself, [CLS] and [SEP]) is its gold head ("dep->head"), and how often the
word that attends most to a dependent is its head ("head->dep", the transposed map).
Next to each relation, the fixed-offset baseline: the best relative position (+-1..+-5)
predicting the head for that relation. Word-level maps (pieces summed as keys, averaged
as queries). Root words have no head word and are not scored. The counts themselves
(SyntaxCounts) are records.syntax_counts, torch-free, so a saved pass's counts read without torch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from attnscope.records.syntax_counts import ALL, DIRECTIONS, OFFSETS, SyntaxCounts
from attnscope.stats.batching import Prepared, UnitMaps, padded
from attnscope.stats.metrics import SAME_SIZE_INT


@dataclass(frozen=True)
class SyntaxBatch:
    """The gold trees of a batch in word units."""

    gold: torch.Tensor  # long [batch, unit]: unit of the gold head, -1 when not scored
    relation: torch.Tensor  # float64 [batch, unit, relation]: one-hot of scored dependents
    candidates: torch.Tensor  # bool [batch, unit]: word units (not special tokens, not padding)
    names: list[str]

    @functools.cached_property
    def gold_index(self) -> torch.Tensor:
        """[batch, unit] long: gold with 0 for a dependent that is not scored (its relation row is zero)."""
        return self.gold.clamp(min=0)

    def offsets(self, bits: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """What layer_correct adds to the bit patterns of a [batch, query, head, key] map, for the rows
        ([batch, dependent, 1, key]) and for the columns ([batch, query, 1, dependent]); cached per dtype.

        For dependent i and unit j: the smallest integer where j may not be predicted (i itself, special
        tokens, padding), +1 where j is a word before i's gold head g (a tie there would be the first
        arg-max: with +1 it beats g, since W[g] > W[j] is W[g] >= W[j] + 1 on integers), else 0.
        """
        cache: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = self.__dict__.setdefault("_offsets", {})
        if bits not in cache:
            n = self.candidates.shape[-1]
            allowed = self.candidates[:, None, :] & ~torch.eye(n, dtype=torch.bool)  # [batch, dependent, unit]
            before = torch.arange(n) < self.gold[:, :, None]  # [batch, dependent, unit]
            lowest = torch.iinfo(bits).min
            offset = torch.where(allowed, before.to(bits), torch.full((), lowest, dtype=bits))
            cache[bits] = offset[:, :, None, :], offset.transpose(1, 2)[:, :, None, :].contiguous()
        return cache[bits]


def syntax_batch(docs: list[Prepared], word_maps: UnitMaps, counts: SyntaxCounts) -> SyntaxBatch:
    """Gold heads in unit positions; folds the batch's totals, offset baseline and unscored words."""
    n_units = word_maps.sum_to.shape[-1]
    gold_rows = [[-1] * n_units for _ in docs]
    rel_rows = [[-1] * n_units for _ in docs]
    names: dict[str, int] = {}
    for b, (d, groups) in enumerate(zip(docs, word_maps.groups, strict=True)):
        assert d.doc.heads is not None and d.doc.relations is not None
        unit_of = {d.words[g[0]]: u for u, g in enumerate(groups) if d.words[g[0]] is not None}
        for w, (head, rel) in enumerate(zip(d.doc.heads, d.doc.relations, strict=True)):
            if head == 0:
                continue
            if w not in unit_of or head - 1 not in unit_of:
                counts.unscored += 1
                continue
            gold_rows[b][unit_of[w]] = unit_of[head - 1]
            rel_rows[b][unit_of[w]] = names.setdefault(rel, len(names))
            counts.relation(rel)
            counts.total[rel] += 1
            offset = head - 1 - w
            if offset in OFFSETS:
                counts.offset_correct[rel][OFFSETS.index(offset)] += 1
    gold = padded(gold_rows, n_units, -1, np.int64)
    rel_ids = padded(rel_rows, n_units, -1, np.int64)
    onehot = torch.zeros((len(docs), n_units, max(len(names), 1)), dtype=torch.float64)
    scored = rel_ids >= 0
    onehot[scored, rel_ids[scored]] = 1.0
    # candidates: word units; special tokens ([CLS], [SEP], ...) and padding are never predicted
    words = [[d.words[g[0]] is not None for g in groups] for d, groups in zip(docs, word_maps.groups, strict=True)]
    candidates = padded(words, n_units, False, np.bool_)
    return SyntaxBatch(gold, onehot, candidates, list(names))


def layer_correct(word_attention: torch.Tensor, sb: SyntaxBatch) -> torch.Tensor:
    """Correct predictions of one layer per direction, head and relation: float64 [direction, head, relation].

    word_attention: [batch, head, unit, unit] word-level maps (non-negative)."""
    return count_hits(layer_hits(word_attention, sb), sb)


def layer_hits(word_attention: torch.Tensor, sb: SyntaxBatch) -> torch.Tensor:
    """Whether each unit's prediction is its gold head: bool [direction, head, batch * unit] (meaningful for
    scored dependents only).

    The prediction is the first arg-max over the allowed words; it is the gold head g exactly when g's
    value, as an integer bit pattern, equals the max after SyntaxBatch.offsets. Integer maxima are
    vectorized where float arg-maxes are not, and the key axis is reduced in place for the rows, the
    query axis for the columns.
    """
    b, h, n, _ = word_attention.shape
    # [batch, query, head, key]: the layout UnitMaps.apply computes, so usually no copy
    bits = word_attention.transpose(1, 2).contiguous().view(SAME_SIZE_INT[word_attention.dtype])
    to_rows, to_columns = sb.offsets(bits.dtype)
    gold = sb.gold_index  # [batch, unit]
    best_rows = (bits + to_rows).amax(-1)  # dep->head: [batch, dependent, head]
    gold_rows = bits.gather(3, gold[:, :, None, None].expand(b, n, h, 1))[..., 0]
    best_columns = (bits + to_columns).amax(1)  # head->dep: [batch, head, dependent]
    gold_columns = bits.gather(1, gold[:, None, None, :].expand(b, 1, h, n))[:, 0]
    hits = torch.stack(((best_rows == gold_rows).permute(2, 0, 1), (best_columns == gold_columns).transpose(0, 1)))
    return hits.reshape(2, h, b * n)


def count_hits(hits: torch.Tensor, sb: SyntaxBatch) -> torch.Tensor:
    """Hits [..., direction, head, batch * unit] -> correct predictions per relation, float64
    [..., direction, head, relation] (exact integers)."""
    return hits.to(torch.float64) @ sb.relation.reshape(hits.shape[-1], -1)


def fold_layers(counts: SyntaxCounts, per_layer: list[torch.Tensor], sb: SyntaxBatch) -> None:
    """Add one batch's [direction, head, relation] counts of every layer into counts."""
    stacked = torch.stack(per_layer).round().to(torch.int64).numpy()  # [layer, direction, head, relation]
    for r, name in enumerate(sb.names):
        counts.relation(name)
        counts.correct[name] += stacked[..., r].transpose(1, 0, 2)


def best_heads(counts: SyntaxCounts) -> list[dict[str, Any]]:
    """Clark et al.'s Table 1: per relation the best head (either direction) and the best offset."""
    rows = []
    for name, (total, correct, offsets) in sorted(counts.with_all().items(), key=lambda kv: -kv[1][0]):
        if total == 0:
            continue
        d, layer, head = np.unravel_index(int(np.argmax(correct)), correct.shape)
        k = int(np.argmax(offsets))
        rows.append({
            "relation": name, "count": int(total),
            "accuracy": float(correct[d, layer, head]) / total,
            "layer": int(layer), "head": int(head), "direction": DIRECTIONS[int(d)],
            "baseline_offset": OFFSETS[k], "baseline_accuracy": float(offsets[k]) / total,
        })
    return rows


__all__ = ["ALL", "DIRECTIONS", "OFFSETS", "SyntaxBatch", "SyntaxCounts", "best_heads", "count_hits", "fold_layers",
           "layer_correct", "layer_hits", "syntax_batch"]
