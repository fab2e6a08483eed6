"""Norm-based attention per layer (Kobayashi, Kuribayashi, Yokoi & Inui 2020, "Attention is Not Only a
Weight: Analyzing Transformers with Vector Norms", EMNLP), as a LayerMixing.

A layer's attention output is a sum of one vector per source position j (attribution.blocks):

    output_i - b_O = sum_j sum_h alpha^h_ij f^h(x_j)

and the method weighs each source by the length of what it moves, ||sum_h alpha^h_ij f^h(x_j)|| (by the Gram matrix
of each key's head vectors: attnscope.norms.summed_norms, the one implementation, here on float32 blocks, the
captured pieces' own precision, equal to attnscope.norms' float64 within 1e-5 of a row's largest norm,
tests/attribution). The norms are lengths,
not shares: here each row is divided by its sum so that a layer's row is a distribution over the source positions
and layers can be rolled out (LayerMixing.rolled). The residual connection and the norms are not part of this
measure (Kobayashi et al. 2020 measure the attention alone; ALTI takes the whole block): rolled() is the mixing
through attention only.

The check: per layer, the vectors whose norms are taken add up, with b_O, to the output projection's result
captured from the real forward pass, within tolerance_for(dtype) * max(1, max |output|) (float32: 1e-5
relative to the layer's largest value, as for ALTI), the sum taken as merged(alpha v) W_O (LayerBlock.attention_sum).
Cost: one forward pass of the transformer up to the last layer's attention output projection; no backward.
Every family with an attnscope adapter, encoder-decoders excepted.
"""

from __future__ import annotations

import numpy as np
import torch

from attnscope.attribution.blocks import LayerBlock, map_blocks, one_text, refuse_unsupported
from attnscope.attribution.mixing import LayerMixing, normalise_rows, verdict
from attnscope.models import Model
from attnscope.norms import head_vectors, summed_norms
from attnscope.placement import dtype_name
from attnscope.records.check_report import tolerance_for


def layer_norms(block: LayerBlock) -> torch.Tensor:
    """||sum_h alpha^h_ij f^h(x_j)|| [query, key] in the block's dtype: attnscope.norms' own computation (there in
    float64 by default), on the block's weights and vectors."""
    heads, n, _ = block.v.shape
    f = torch.empty(n, heads, block.w_o.shape[-1], dtype=block.w_o.dtype, device=block.w_o.device)
    head_vectors(block.v, block.w_o, out=f.transpose(0, 1))  # written key by key, as the Gram matrix reads it
    return summed_norms(block.weights, f.transpose(0, 1))  # [head, key, d_model] view


def output_error(block: LayerBlock, summed: torch.Tensor) -> float:
    """max |summed_i + b_O - output_i| over the layer, relative to max(1, max |output|); summed [query, d_model]
    is sum_j of the vectors alpha f(x_j) whose norms are taken."""
    scale = max(1.0, float(block.output.abs().max()))
    return float((summed + block.b_o - block.output).abs().max()) / scale


def norm_based(m: Model, inputs: dict[str, torch.Tensor]) -> LayerMixing:
    """Norm-based attention per layer for one text, rows normalised (inputs: a tokenizer's tensors)."""
    refuse_unsupported(m, "norm", whole_block=False)
    one_text(inputs, "norm")

    def one(block: LayerBlock) -> tuple[np.ndarray, float]:  # each layer as the forward pass captures it
        return normalise_rows(layer_norms(block).cpu().numpy()), output_error(block, block.attention_sum())

    matrices, errors = zip(*map_blocks(m, inputs, whole_block=False, fn=one, dtype=torch.float32), strict=True)
    bound = tolerance_for(dtype_name(m.dtype))
    max_error = np.asarray(errors, dtype=np.float64)
    detail = (f"per layer, the vectors alpha f(x_j) whose norms are taken add up with b_O to the output "
              f"projection's result captured from the forward pass: max error {float(max_error.max()):.1e} "
              f"relative to max(1, max |output|), bound {bound:.0e}")
    return LayerMixing("norm", np.stack(matrices), max_error, bound, verdict(max_error, bound), detail, 1)


__all__ = ["layer_norms", "norm_based", "output_error"]
