"""ALTI: Aggregation of Layer-wise Token-to-token Interactions (Ferrando, Gállego & Costa-jussà 2022,
"Measuring the Mixing of Contextual Information in the Transformer", EMNLP).

Per layer, the attention block's output y_i for position i is split into one transformed vector per source
position j, y_i = sum_j T_i(x_j) + (the biases), from the captured pieces (attribution.blocks):

    post-norm (BERT, RoBERTa, ELECTRA, DistilBERT), y_i = LN(z_i + b_O), z_i = sum_j z_ij:
        z_ij    = sum_h alpha^h_ij f^h(x_j) + [i == j] x_i             # attention plus the residual
        T_i(x_j) = gamma * (z_ij - mean(z_ij)) / sigma_i                # LN applied linearly per source
        bias_i  = gamma * (b_O - mean(b_O)) / sigma_i + beta
      LayerNorm is not linear; as in the paper, it is applied to each source's share as the linear map
      "centre, scale by gamma / sigma_i" with sigma_i = sqrt(var(z_i + b_O) + eps), the statistic of the
      FULL sum for position i (not of each share), so the shares add up to the real output exactly.
    pre-norm (GPT-2, Llama, Mistral, Qwen2/3, Phi-3), y_i = x_i + attention(norm(x))_i:
        T_i(x_j) = sum_h alpha^h_ij f^h(norm(x_j)) + [i == j] x_i ;  bias_i = b_O
      The norm (LayerNorm or RMSNorm) acts on each source x_j alone, before the values are taken, so it is
      part of f^h(x_j) exactly: no linear approximation is needed there.
    sandwich (Gemma 2, Gemma 3), y_i = x_i + RMSNorm(a_i + b_O), a_i = sum_j sum_h alpha^h_ij f^h(norm(x_j)):
        T_i(x_j) = gamma * sum_h alpha^h_ij f^h(norm(x_j)) / rms_i + [i == j] x_i ;  bias_i = gamma * b_O / rms_i
      the RMSNorm after attention applied linearly per source as above, with rms_i = sqrt(mean((a_i + b_O)^2)
      + eps) of the full sum (gamma = 1 + w, as Gemma scales).

Contributions are the paper's distance-based ones (its Eq. 10-11): with d_ij = ||y_i - T_i(x_j)||_1,

    c_ij = max(0, ||y_i||_1 - d_ij) / sum_k max(0, ||y_i||_1 - d_ik)

The clip at 0 is part of the method (a source whose transformed vector is farther from y_i than the origin
is contributes nothing), as in the authors' code (normalize_contributions, scaling="min_sum"). Layers are
aggregated by rollout (LayerMixing.rolled) with no residual added: the residual is inside T already.

The check: per layer, sum_j T_i(x_j) + bias_i (computed in float64 from the captured float32 pieces)
equals the block output captured from the real forward pass (the LayerNorm's output, or what enters the
layer's second norm) within tolerance_for(dtype) * max(1, max |y|): float32's 1e-5 relative to the layer's
largest output value, since the model itself rounds each value to 2^-24 of its size (a pre-norm residual
stream reaches values in the hundreds). Cost: one forward pass; no backward.
"""

from __future__ import annotations

import numpy as np
import torch

from attnscope.attribution.blocks import LayerBlock, capture_blocks, one_text, refuse_unsupported
from attnscope.attribution.mixing import LayerMixing, normalise_rows, verdict
from attnscope.models import Model
from attnscope.placement import dtype_name
from attnscope.records.check_report import tolerance_for


def transformed_vectors(block: LayerBlock) -> tuple[torch.Tensor, torch.Tensor]:
    """T_i(x_j) [query, key, d_model] and the bias part [query, d_model] of one layer's block output."""
    assert block.residual is not None
    z = block.attention_vectors().contiguous()  # [query, key, d_model]: a fresh tensor, edited in place below
    diagonal = torch.arange(z.shape[0], device=z.device)
    n = block.norm
    if n is None or not n.sandwich:
        z[diagonal, diagonal] += block.residual  # + [i == j] x_i, before any norm
    if n is None:
        return z, block.b_o.expand(z.shape[0], -1)
    full = z.sum(dim=1) + block.b_o  # [query, d_model]: what the norm receives
    spread = full.var(dim=-1, unbiased=False) if n.centred else full.pow(2).mean(dim=-1)  # [query]
    scale = n.gamma / torch.sqrt(spread + n.eps)[:, None]  # [query, d_model]: the full sum's statistic
    if n.centred:
        z.sub_(z.mean(dim=-1, keepdim=True))
        bias = (block.b_o - block.b_o.mean()) * scale + n.beta  # [query, d_model]
    else:
        bias = block.b_o * scale + n.beta
    t = z.mul_(scale[:, None, :])  # [query, key, d_model]
    if n.sandwich:
        t[diagonal, diagonal] += block.residual  # the residual joins after the norm
    return t, bias


def block_error(block: LayerBlock, t: torch.Tensor, bias: torch.Tensor) -> float:
    """max |sum_j T_i(x_j) + bias_i - y_i| over the layer, relative to max(1, max |y|)."""
    assert block.block_output is not None
    y = block.block_output
    scale = max(1.0, float(y.abs().max()))
    return float((t.sum(dim=1) + bias - y).abs().max()) / scale


def contributions(t: torch.Tensor, bias: torch.Tensor) -> np.ndarray:
    """The paper's c_ij: max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1), rows normalised. [query, key]"""
    y = t.sum(dim=1) + bias  # [query, d_model]
    distance = torch.cdist(y[:, None, :], t, p=1)[:, 0]  # ||y_i - T_i(x_j)||_1: [query, 1, key] -> [query, key]
    # ||y_i||_1 = ||y_i - 0||_1 the same way, so a source with T_i(x_j) = 0 (a later token) gets exactly 0
    norm = torch.cdist(y[:, None, :], torch.zeros_like(y[:, None, :]), p=1)[:, 0]  # [query, 1]
    closeness = (norm - distance).clamp(min=0.0)  # the method's clip
    return normalise_rows(closeness.cpu().numpy())


def alti(m: Model, inputs: dict[str, torch.Tensor]) -> LayerMixing:
    """ALTI's per-layer contributions for one text (inputs: a tokenizer's tensors, batch of one)."""
    refuse_unsupported(m, "alti", whole_block=True)
    one_text(inputs, "alti")
    blocks = capture_blocks(m, inputs, whole_block=True)
    matrices, errors = [], []
    for block in blocks:
        t, bias = transformed_vectors(block)
        errors.append(block_error(block, t, bias))
        matrices.append(contributions(t, bias))
    bound = tolerance_for(dtype_name(m.dtype))
    max_error = np.asarray(errors, dtype=np.float64)
    norm = blocks[0].norm
    where = ("residual + attention output" if norm is None else "LayerNorm output" if not norm.sandwich
             else "residual + RMSNorm(attention output)")
    detail = (f"per layer, the transformed vectors plus biases add up to the block's {where} captured from the "
              f"forward pass: max error {float(max_error.max()):.1e} relative to max(1, max |y|), bound {bound:.0e}")
    return LayerMixing("alti", np.stack(matrices), max_error, bound, verdict(max_error, bound), detail, 1)


__all__ = ["alti", "block_error", "contributions", "transformed_vectors"]
