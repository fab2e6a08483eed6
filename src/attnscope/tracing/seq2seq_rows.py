"""One row of a traced encoder-decoder batch as three Traces (encoder, decoder, cross), arrays cut on first use.

A cross-attention trace's queries are the target's tokens and its keys the source's: its q, x, context and
output run over the target, its k, v and memory over the source, its scores and weights are [layer, head,
target, source]. Each side is cut to its own length (padding dropped) the first time a stage is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnscope.maths import AttentionParams
from attnscope.records.arrays import Pending, TraceArrays
from attnscope.records.trace import Trace
from attnscope.tokens import Token
from attnscope.tracing import rows
from attnscope.verify.seq2seq import KindCapture, KindCheck


@dataclass
class KindResult:
    """One kind of attention of a traced batch: what every row's Trace of that kind is cut from."""

    info: dict[str, Any]  # the model's description with this kind's sizes, causality and name
    capture: KindCapture
    check: KindCheck | None  # None without the recompute
    params: list[AttentionParams] | None
    scaling: list[float]  # per layer, as the attention function was called
    unsupported: str | None


def kind_traces(traced: list[KindResult], row: int, source_tokens: list[Token], target_tokens: list[Token],
                source: str, target: str, truncated: tuple[bool, bool]) -> tuple[Trace, Trace, Trace]:
    """(encoder, decoder, cross) of one row; truncated: (the source was, the target was)."""
    out = []
    for r in traced:
        kc = r.capture
        queries = source_tokens if kc.kind == "encoder" else target_tokens
        keys = target_tokens if kc.kind == "decoder" else source_tokens
        out.append(Trace(
            model=r.info, text=source if kc.kind == "encoder" else target, pair=None, tokens=queries,
            arrays=row_arrays(kc, row, len(queries), len(keys)), scaling=r.scaling,
            truncated=truncated[0] if kc.kind == "encoder" else truncated[1],
            comparisons=r.check.comparisons(row) if r.check is not None else [],
            unsupported=r.unsupported, output_projection=[p.w_o.numpy() for p in r.params] if r.params else None,
            attention=kc.kind, key_tokens=keys if kc.kind == "cross" else None,
        ))
    return out[0], out[1], out[2]


def row_arrays(kc: KindCapture, row: int, n_query: int, n_key: int) -> TraceArrays:
    """One row's stages [layer, ...] (memory [key, d_model]), each side cut to its length; scores from q, k."""
    more = {}
    if kc.memory is not None:
        memory = kc.memory[0]  # every cross layer reads the same encoder output
        more["memory"] = Pending(lambda: memory[row, :n_key].numpy().copy())
    return rows.row_arrays(kc.layers, row, n_query, n_key, more)
