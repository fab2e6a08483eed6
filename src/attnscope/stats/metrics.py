"""Per-head statistics of attention maps (Clark et al. 2019), as pure functions of a batch of maps.

Every metric takes a batch of maps `A` [batch, head, query, key] over "units" (tokens, or
words with --word-level) and a `Units` description of that batch, and returns one value
per document and head [batch, head] with a flag per document saying whether it is defined
[batch]. Each document is one observation: the corpus figure is the mean over documents.
Padding units have zero columns and excluded rows, so padding never changes a value.
See docs/stats.md for the definitions in words.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import torch
import torch.nn.functional as F

Values = tuple[torch.Tensor, torch.Tensor]  # ([batch, head] float64, [batch] bool: defined)

# The integer type of each float type's size: viewed as one, non-negative floats order like their values.
SAME_SIZE_INT = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
                 torch.bfloat16: torch.int16}


@dataclass(frozen=True)
class Units:
    """What each query/key position of a batch of maps is. All tensors are [batch, unit]."""

    valid: torch.Tensor  # bool: a real unit, not padding
    rows: torch.Tensor  # bool: a query row that counts (valid; for causal models row 0 is excluded)
    kinds: dict[str, torch.Tensor]  # bool per kind: "cls", "sep", "punct", "sink"
    causal: bool

    @functools.cached_property
    def n_rows(self) -> torch.Tensor:
        """[batch] float64: rows that count per document (computed once per batch)."""
        return self.rows.sum(-1).to(torch.float64)

    @functools.cached_property
    def row_weights(self) -> torch.Tensor:
        """[batch, 1, query] float64: 1 / (rows that count) on each row that counts, else 0."""
        return (self.rows.to(torch.float64) / torch.clamp(self.n_rows, min=1.0)[:, None])[:, None, :]

    def selector(self, kind: str, dtype: torch.dtype) -> torch.Tensor:
        """[batch, 1, 1, key] indicator of a kind ("valid": real units), cached per batch and dtype."""
        cache: dict[tuple[str, torch.dtype], torch.Tensor] = self.__dict__.setdefault("_selectors", {})
        if (kind, dtype) not in cache:
            cache[(kind, dtype)] = (self.valid if kind == "valid" else self.kinds[kind]).to(dtype)[:, None, None, :]
        return cache[(kind, dtype)]

    def few_keys(self, kind: str) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """The keys of a kind when no document has more than two: (index [batch, most], present [batch, most]
        or None when every document has the most), where most is the largest count; else None. Cached."""
        cache: dict[str, tuple[torch.Tensor, torch.Tensor | None] | None] = self.__dict__.setdefault("_few_keys", {})
        if kind not in cache:
            flags = self.kinds[kind]
            counts = flags.sum(-1)
            most = int(counts.max())
            if most > 2:
                cache[kind] = None
            else:  # a stable sort brings a document's keys of the kind first, in order
                index = torch.sort(flags.to(torch.uint8), dim=-1, descending=True, stable=True).indices[:, :most]
                cache[kind] = index, None if bool((counts == most).all()) else flags.gather(1, index)
        return cache[kind]

    @functools.cached_property
    def first_cls(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(the first [CLS] unit [batch] long, whether there is one [batch] bool)."""
        cls = self.kinds["cls"]  # [batch, unit]
        return torch.argmax(cls.to(torch.int64), dim=-1), cls.any(-1)

    def gaps(self, dtype: torch.dtype) -> torch.Tensor:
        """[query, key] |i - j|, cached per batch and dtype."""
        cache: dict[torch.dtype, torch.Tensor] = self.__dict__.setdefault("_gaps", {})
        if dtype not in cache:
            pos = torch.arange(self.valid.shape[-1], dtype=dtype)
            cache[dtype] = (pos[:, None] - pos[None, :]).abs()
        return cache[dtype]

    @functools.cached_property
    def uniform_entropy(self) -> torch.Tensor:
        """[batch, 1] float64: the mean over counted rows of ln(keys the row can see)."""
        n = self.valid.shape[-1]
        visible = self.valid[:, None, :].expand(-1, n, -1)  # [batch, query, key]
        if self.causal:
            visible = visible & torch.ones(n, n, dtype=torch.bool).tril()
        log_count = torch.log(torch.clamp(visible.sum(-1).to(torch.float64), min=1.0))  # [batch, query]
        return row_mean(log_count[:, None, :], self)[0]


MetricFn = Callable[[torch.Tensor, Units], Values]
RowFn = Callable[[torch.Tensor, Units], torch.Tensor]  # maps -> one value per row [batch, head, query]
Reduce = Callable[[torch.Tensor, Units], Values]  # values per row [..., batch, head, query] -> per document


@dataclass(frozen=True)
class Metric:
    """A named per-head statistic. `source` names the map it reads (engine inputs: "weights").

    Most metrics are a value per row reduced over the rows (made with `row_metric`): they keep `per_row`
    and `reduce`, so the engine computes each per-row function once per layer, however many metrics
    reduce it, and takes all the means over rows in one step. That gives the same numbers as `fn`.
    """

    name: str
    fn: MetricFn
    description: str
    source: str = "weights"
    models: str = "all"  # "all", "bidirectional" or "causal"
    per_row: RowFn | None = None
    reduce: Reduce | None = None  # with per_row: fn(maps, units) = reduce(per_row(maps, units), units)

    def applies(self, causal: bool) -> bool:
        return self.models == "all" or self.models == ("causal" if causal else "bidirectional")


def row_metric(name: str, per_row: RowFn, description: str, source: str = "weights", models: str = "all",
               reduce: Reduce | None = None) -> Metric:
    """The metric reduce(per_row(A)); by default the mean (1/n) sum_i per_row(A)[i] over the rows that count."""
    reduce = reduce or row_mean
    return Metric(name, functools.partial(_reduced, per_row, reduce), description, source, models, per_row, reduce)


def _reduced(per_row: RowFn, reduce: Reduce, maps: torch.Tensor, units: Units) -> Values:
    return reduce(per_row(maps, units), units)


def clean(maps: torch.Tensor, units: Units) -> torch.Tensor:
    """Maps with padding keys zeroed: [batch, head, query, key] (a product: NaN stays NaN)."""
    return maps * units.selector("valid", maps.dtype)


def row_mean(per_row: torch.Tensor, units: Units) -> Values:
    """Mean (in float64) over the rows that count: [..., batch, head, query] -> [..., batch, head]."""
    kept = torch.where(units.rows[:, None, :], per_row, 0.0)  # NaN in a counted row stays
    return (kept * units.row_weights).sum(-1), units.n_rows > 0  # the product is taken in float64


def row_attention_to(kind: str) -> RowFn:
    """sum_{j of this kind} A[i, j] for each row i.

    When no document has more than two keys of the kind ([CLS], [SEP], the sink), only those are read:
    a sum of at most two non-zero terms rounds the same in any order, so it equals the sum over the row.
    """

    def fn(maps: torch.Tensor, units: Units) -> torch.Tensor:
        few = units.few_keys(kind)
        if few is None:
            return (maps * units.selector(kind, maps.dtype)).sum(-1)  # [batch, head, query]
        index, present = few
        b, h, q, _ = maps.shape
        picked = maps.gather(3, index[:, None, None, :].expand(b, h, q, -1))  # [batch, head, query, <= 2]
        if present is not None:
            picked = picked * present[:, None, None, :].to(maps.dtype)
        if picked.shape[-1] == 2:  # the sum of two terms: one addition (a reduction over 2 is slow)
            return picked[..., 0] + picked[..., 1]
        return picked[..., 0] if picked.shape[-1] == 1 else torch.zeros((b, h, q), dtype=maps.dtype)

    return fn


def attention_to(kind: str) -> MetricFn:
    """(1/n) sum_i sum_{j of this kind} A[i, j]."""
    return functools.partial(_reduced, row_attention_to(kind), row_mean)


def attention_at_offset(offset: int) -> RowFn:
    """A[i, i + offset] for each row i (0 where i + offset is outside): 0 is the token itself, -1 the
    previous, +1 the next."""

    def fn(maps: torch.Tensor, units: Units) -> torch.Tensor:
        diagonal = torch.diagonal(maps, offset=offset, dim1=-2, dim2=-1)  # [batch, head, n - |offset|]
        return F.pad(diagonal, (0, offset) if offset >= 0 else (-offset, 0))  # [batch, head, query]

    return fn


def row_entropy(maps: torch.Tensor) -> torch.Tensor:
    """-sum_j A[i,j] ln A[i,j] in nats, with 0 ln 0 = 0: [batch, head, query].

    ln is taken of max(A, tiny) so that 0 * ln 0 gives 0 (a weight below the smallest normal
    float changes the sum by less than 1e-35); NaN stays NaN.
    """
    tiny = torch.finfo(maps.dtype).tiny
    terms = maps.clamp_min(tiny).log_().mul_(maps)  # one temporary, filled in place
    return -terms.sum(-1)


def entropy(maps: torch.Tensor, units: Units) -> torch.Tensor:
    """The entropy of each row (nats)."""
    return row_entropy(maps)


def uniform_entropy(maps: torch.Tensor, units: Units) -> Values:
    """The entropy of uniform attention over the keys a row can see: ln n, or ln(i+1) when causal."""
    return units.uniform_entropy.expand(-1, maps.shape[1]), units.n_rows > 0


def at_first_cls(per_row: torch.Tensor, units: Units) -> Values:
    """The value of the [CLS] row (the first [CLS] unit of each document): [batch, head, query] -> [batch, head]."""
    first, ok = units.first_cls
    b, h, _ = per_row.shape
    picked = torch.gather(per_row, 2, first[:, None, None].expand(b, h, 1))[..., 0].to(torch.float64)
    return torch.where(ok[:, None], picked, torch.zeros((), dtype=picked.dtype)), ok


def distance(maps: torch.Tensor, units: Units) -> torch.Tensor:
    """sum_j A[i,j] |i - j| for each row i, in units (tokens or words)."""
    return (maps * units.gaps(maps.dtype)).sum(-1)


def concentration(maps: torch.Tensor, units: Units) -> torch.Tensor:
    """max_j A[i,j] for each row i.

    Taken on the bit patterns as integers, which order like the values for non-negative floats (weights
    are) and reduce several times faster than floats over a short row. The sign bit is cleared first,
    so a NaN of either sign still comes out as the max."""
    bits = maps.view(SAME_SIZE_INT[maps.dtype])
    return (bits & torch.iinfo(bits.dtype).max).amax(-1).view(maps.dtype)


# The built-in metrics, computed by every run (a run's settings add metric sets to them, see
# attnscope.stats.metric_sets): a read-only table, never changed at run time.
BUILTIN_METRICS: Mapping[str, Metric] = MappingProxyType({m.name: m for m in (
    row_metric("cls", row_attention_to("cls"), "attention to [CLS]", models="bidirectional"),
    row_metric("sep", row_attention_to("sep"), "attention to [SEP]", models="bidirectional"),
    row_metric("sink", row_attention_to("sink"), "attention to the first token (the sink)", models="causal"),
    row_metric("punct", row_attention_to("punct"), 'attention to "." and ","'),
    row_metric("self", attention_at_offset(0), "attention to the token itself"),
    row_metric("prev", attention_at_offset(-1), "attention to the previous token (j = i - 1)"),
    row_metric("next", attention_at_offset(1), "attention to the next token (j = i + 1)"),
    row_metric("entropy", entropy, "attention entropy (nats)"),
    Metric("entropy_uniform", uniform_entropy, "entropy of uniform attention (nats): the baseline"),
    row_metric("entropy_cls", entropy, "entropy of the [CLS] row (nats)", models="bidirectional", reduce=at_first_cls),
    row_metric("distance", distance, "mean attention distance (tokens)"),
    row_metric("concentration", concentration, "mean of the largest weight of each row"),
)})


# Head classes: (name, metric, threshold) meaning mean(metric) > threshold; "broad" compares
# the entropy with the uniform baseline: mean(entropy) > BROAD_RATIO * mean(entropy_uniform).
BROAD_RATIO = 0.8
CLASS_RULES: tuple[tuple[str, str, float], ...] = (
    ("previous-token", "prev", 0.5),
    ("next-token", "next", 0.5),
    ("[CLS]", "cls", 0.6),
    ("[SEP]", "sep", 0.6),
    ("sink", "sink", 0.6),
    ("punctuation", "punct", 0.6),
)


def head_classes(means: dict[str, np.ndarray]) -> list[list[list[str]]]:
    """Classes of each head from the corpus means [layer, head] of each metric: [layer][head] -> names."""
    shape = means["entropy"].shape
    out: list[list[list[str]]] = [[[] for _ in range(shape[1])] for _ in range(shape[0])]
    for layer in range(shape[0]):
        for head in range(shape[1]):
            names = out[layer][head]
            ent, base = means["entropy"][layer, head], means["entropy_uniform"][layer, head]
            if math.isfinite(ent) and base > 0 and ent > BROAD_RATIO * base:
                names.append("broad")
            for name, metric, threshold in CLASS_RULES:
                if metric in means and means[metric][layer, head] > threshold:
                    names.append(name)
    return out
