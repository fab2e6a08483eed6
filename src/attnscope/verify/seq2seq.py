"""Verify an encoder-decoder's three kinds of attention: recompute vs capture vs the model's own outputs.

Each kind is recomputed layer by layer with `maths.multi_head_attention` from its captured input x and the
layer's weights: the encoder's self-attention over the source, the decoder's causal self-attention over the
target, and the cross-attention with q from the decoder's x and k, v from the encoder's output (the memory).
T5's relative position bias is recomputed from its stack's first-layer table and compared as its own stage.
The errors go into a `check.ErrorTable` per kind (the key side of cross-attention is the source's padding).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnscope import maths
from attnscope.records.check_report import Comparison
from attnscope.stages import STAGES
from attnscope.verify.check import ErrorTable, compare_chunk
from attnscope.verify.recompute import CHUNK_BYTES, RECOMPUTED_STAGES, layer_mask, row_chunks

CHECKED = (*RECOMPUTED_STAGES, "position_bias")  # the stages each layer's recompute keeps


@dataclass
class KindCapture:
    """One kind of attention of a padded batch, one [batch, ...] tensor per layer for each stage."""

    kind: str  # "encoder", "decoder" or "cross"
    layers: dict[str, list[torch.Tensor]]  # x, q, k, v, weights, context, output; position_bias (T5 self kinds)
    keep: torch.Tensor  # [batch, query]: 1 for real tokens
    key_keep: torch.Tensor  # [batch, key]: the source's for cross-attention, else keep
    memory: list[torch.Tensor] | None = None  # cross: the k/v input each layer got [batch, key, d_model]


@dataclass
class KindCheck:
    """The errors of one kind: the table, and the comparisons it does not hold (memory, position_bias)."""

    table: ErrorTable
    extra: list[tuple[str, str, np.ndarray]]  # (stage, source, errors [batch, layer, head|1])

    def comparisons(self, row: int) -> list[Comparison]:
        """Recompute first, then the model's; each in stage order (position_bias after scores)."""
        found = [*self.table.comparisons(row), *(Comparison(st, src, e[row]) for st, src, e in self.extra)]
        return sorted(found, key=lambda c: (c.source != "recompute", STAGES.index(c.stage)))


@torch.no_grad()
def verify_kind(cap: KindCapture, reference: dict[str, list[torch.Tensor]],
                params: list[maths.AttentionParams] | None) -> KindCheck:
    """Recompute each layer of one kind from its captured input and weights, compare, and compare with the
    model's own outputs (reference: stage -> [batch, ...] per layer; "memory": the encoder's output, once)."""
    weights = cap.layers["weights"]
    table = ErrorTable(cap.keep, len(weights), int(weights[0].shape[1]), key_keep=cap.key_keep)
    extra: list[tuple[str, str, np.ndarray]] = []
    n_rows = int(cap.keep.shape[0])
    if params is not None and "x" in cap.layers:
        bias_errors = _recompute(cap, params, table)
        if bias_errors is not None:  # the same for every row
            extra.append(("position_bias", "recompute", np.broadcast_to(bias_errors, (n_rows, *bias_errors.shape))))
    for stage, ref in reference.items():
        if stage != "memory":
            for layer in range(len(weights)):
                table.add(stage, "model", layer, cap.layers[stage][layer], ref[layer])
    if cap.memory is not None and "memory" in reference:
        extra.append(("memory", "model", _memory_errors(cap.memory, reference["memory"][0], cap.key_keep)))
    return KindCheck(table, extra)


def _recompute(cap: KindCapture, params: list[maths.AttentionParams], table: ErrorTable) -> np.ndarray | None:
    """Fill the table layer by layer, a few rows at a time; return position_bias errors [layer, head] (T5)."""
    x, layers = cap.layers["x"], cap.layers
    n_rows, n_query, n_key = int(x[0].shape[0]), int(cap.keep.shape[1]), int(cap.key_keep.shape[1])
    bias_errors = np.zeros((len(params), params[0].n_heads)) if params[0].relative_bias is not None else None
    for layer, p in enumerate(params):
        mask = _mask(cap, p, n_query)  # [batch, 1, query, key] or None
        w_o_norms = p.w_o.T.norm(dim=1)  # |W_O[:, j]| [d_model]
        for rows in row_chunks(p.n_heads * n_query * n_key, n_rows, CHUNK_BYTES):
            memory = cap.memory[layer][rows] if cap.memory is not None else None
            rec = maths.multi_head_attention(x[layer][rows], p, None if mask is None else mask[rows], keep=CHECKED,
                                             in_place=True, memory=memory)
            compare_chunk(table, {s: ts[layer] for s, ts in layers.items()}, {}, w_o_norms, layer, rows, rec)
        if bias_errors is not None:  # the model's bias [1, head, query, key] is the same for every row
            captured = layers["position_bias"][layer][0].float()
            recomputed = maths.relative_position_bias(n_query, n_key, p.relative_bias)  # type: ignore[arg-type]
            bias_errors[layer] = (captured - recomputed).abs().flatten(1).amax(1).numpy()
    return bias_errors


def _mask(cap: KindCapture, p: maths.AttentionParams, n_query: int) -> torch.Tensor | None:
    """Padded keys (the source's for cross-attention) and, for the decoder, future keys."""
    if cap.kind != "cross":
        mask = layer_mask(n_query, p.window, cap.keep)
        return None if mask is None else mask.expand(int(cap.keep.shape[0]), 1, n_query, n_query)
    if bool(cap.key_keep.all()):
        return None
    return maths.padding_mask(cap.key_keep)[:, None]  # [batch, 1, 1, key]


def _memory_errors(memory: list[torch.Tensor], encoder_output: torch.Tensor, key_keep: torch.Tensor) -> np.ndarray:
    """Max |the k/v input each cross layer got - the encoder's output| over real source tokens: [batch, layer, 1]."""
    valid = key_keep.bool()[:, :, None]  # [batch, key, 1]
    errors = [(m.float() - encoder_output.float()).abs().masked_fill(~valid, 0.0).amax(dim=(1, 2)) for m in memory]
    return torch.stack(errors, dim=1)[:, :, None].numpy()  # [batch, layer, 1]
