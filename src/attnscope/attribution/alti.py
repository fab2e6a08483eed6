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

How it is computed. The block is first rewritten (parts()) so that every norm's per-query scale sits in the
weights and its centring and gamma in W_O: T_i(x_j) = sum_h alpha'^h_ij f'^h(x_j) + [i == j] r_i (the same maths
as above, reordered), with sigma_i (rms_i) the statistic of the full sum as the model's own norm received it
(captured), and y_i the block output captured from the forward pass. The distances are then taken a few keys at a
time (one batched matmul per chunk of keys, y subtracted inside it, into one reused buffer): T - y for those keys
and ||y_i - T_i(x_j)||_1, in
float32, the captured pieces' own precision (float64 costs 1.5x; c_ij moves by < 1e-5, measured 5.5e-07 on MiniLM
and 5.8e-07 on SmolLM2 against the whole tensor in float64). A decoder's chunk skips the queries before it (their
weights on it are exactly 0, so T = 0 and the distance is ||y_i||_1). transformed_vectors() builds the whole
[query, key, d_model] tensor from the same parts: the walkthrough and the tests read it; alti() does not.
The cost is in the T's themselves: tokens^2 x heads x d_model multiplications per layer (at MiniLM's 128 tokens a
third of a forward pass's), plus two passes over them (absolute value, sum; the subtraction rides in the matmul).

The check: per layer, sum_j T_i(x_j) + bias_i equals the block output captured from the real forward pass (the
LayerNorm's output, or what enters the layer's second norm) within tolerance_for(dtype) * max(1, max |y|):
float32's 1e-5 relative to the layer's largest output value, since the model itself rounds each value to 2^-24 of
its size (a pre-norm residual stream reaches values in the hundreds). The sum over sources is taken from the
float32 pieces the T's are built from, summed over j before W_O (merged(alpha' v) W'_O + r_i, by linearity, as
norm-based attention sums its vectors), not by adding up the chunks; the chunks equal the whole tensor (tests).
A dropped residual, a wrong norm scale or a wrong W_O fails it. Cost: one forward pass of the transformer up to the
last layer's attention block (attribution.blocks); no backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnscope.attribution.blocks import LayerBlock, capture_blocks, merged_context, one_text, refuse_unsupported
from attnscope.attribution.mixing import LayerMixing, normalise_rows, verdict
from attnscope.models import Model
from attnscope.norms import head_vectors
from attnscope.placement import dtype_name
from attnscope.records.check_report import tolerance_for

CHUNK = 3 * 2**17  # float32 values of T per batched matmul (1.5 MiB): 8 keys of MiniLM at 128 tokens (fastest of 2-16)


@dataclass(frozen=True)
class Parts:
    """One layer's block as T_i(x_j) = sum_h weights[h, i, j] (v[h, j] W[h]) + [i == j] diagonal[i]."""

    weights: torch.Tensor  # [head, query, key]: alpha^h_ij / sigma_i (/ rms_i) where a norm follows the sum
    v: torch.Tensor  # [head, key, d_head]
    w: torch.Tensor  # [head * d_head, d_model]: W_O, centred over d_model and times gamma where a LayerNorm follows
    diagonal: torch.Tensor  # [query, d_model]: the residual's share, through the norm as the block takes it
    bias: torch.Tensor  # [query, d_model]
    resultant: torch.Tensor  # [query, d_model]: y_i, the block output captured (= sum_j T_i(x_j) + bias_i: checked)

    @property
    def f(self) -> torch.Tensor:
        """f'^h(x_j) = v^h_j W'^h: [head, key, d_model]."""
        return head_vectors(self.v, self.w)


def _centred(x: torch.Tensor) -> torch.Tensor:
    return x - x.mean(dim=-1, keepdim=True)


def parts(block: LayerBlock) -> Parts:
    """The block rewritten with each norm's per-query scale 1 / sigma_i folded into the weights (module doc)."""
    assert block.residual is not None and block.block_output is not None
    n, x = block.norm, block.residual
    if n is None:  # pre-norm: y_i = x_i + attention output, nothing after the sum
        return Parts(block.weights, block.v, block.w_o, x, block.b_o.expand(x.shape[0], -1), block.block_output)
    full = n.received  # [query, d_model]: the full sum, as the model's norm received it
    spread = full.var(dim=-1, unbiased=False) if n.centred else full.pow(2).mean(dim=-1)  # [query]
    inv = 1.0 / torch.sqrt(spread + n.eps)  # [query]: the FULL sum's statistic, one per position
    w_o, b_o = (_centred(block.w_o), _centred(block.b_o)) if n.centred else (block.w_o, block.b_o)
    bias = b_o * n.gamma * inv[:, None] + n.beta  # [query, d_model]
    # sandwich: the residual joins after the norm, untouched
    diagonal = x if n.sandwich else (_centred(x) if n.centred else x) * n.gamma * inv[:, None]
    return Parts(block.weights * inv[None, :, None], block.v, w_o * n.gamma, diagonal, bias, block.block_output)


def transformed_vectors(block: LayerBlock) -> tuple[torch.Tensor, torch.Tensor]:
    """T_i(x_j) [query, key, d_model] and the bias part [query, d_model] of one layer's block output, in the
    block's dtype (float64 for the walkthrough and the tests)."""
    p = parts(block)
    t = torch.einsum("hqk,hkd->qkd", p.weights, p.f).contiguous()  # [query, key, d_model]
    diagonal = torch.arange(t.shape[0], device=t.device)
    t[diagonal, diagonal] += p.diagonal  # + [i == j] r_i
    return t, p.bias


def block_error(block: LayerBlock, t: torch.Tensor, bias: torch.Tensor) -> float:
    """max |sum_j T_i(x_j) + bias_i - y_i| over the layer, relative to max(1, max |y|)."""
    return summed_error(block, t.sum(dim=1) + bias)


def summed_error(block: LayerBlock, summed: torch.Tensor) -> float:
    """max |summed_i - y_i| over the layer ([query, d_model]: the T's summed plus the biases), relative to
    max(1, max |y|) with y the captured block output."""
    assert block.block_output is not None
    y = block.block_output
    scale = max(1.0, float(y.abs().max()))
    return float((summed.double() - y).abs().max()) / scale


def contributions(t: torch.Tensor, bias: torch.Tensor) -> np.ndarray:
    """The paper's c_ij: max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1), rows normalised. [query, key]"""
    y = t.sum(dim=1) + bias  # [query, d_model]
    distance = torch.cdist(y[:, None, :], t, p=1)[:, 0]  # ||y_i - T_i(x_j)||_1: [query, 1, key] -> [query, key]
    return _normalised(y, distance)


def _normalised(y: torch.Tensor, distance: torch.Tensor) -> np.ndarray:
    # ||y_i||_1 = ||y_i - 0||_1, so a source with T_i(x_j) = 0 (a later token) gets exactly 0
    closeness = (y.double().abs().sum(dim=-1, keepdim=True) - distance.double()).clamp(min=0.0)  # the method's clip
    return normalise_rows(closeness.cpu().numpy())


def layer_alti(block: LayerBlock, chunk: int = CHUNK) -> tuple[np.ndarray, float]:
    """One layer's contributions c_ij [query, key] and its check's error (summed_error of the T's used), with
    the T's built a chunk of keys at a time in float32 (module doc)."""
    p = parts(block)
    weights, v, w, diagonal = p.weights.float(), p.v.float(), p.w.float(), p.diagonal.float()  # as T is built
    by_key = weights.permute(2, 1, 0).contiguous()  # [key, query, head]
    heads, n, _ = v.shape
    f = torch.empty(n, heads, w.shape[-1], dtype=w.dtype, device=w.device)  # [key, head, d_model]
    head_vectors(v, w, out=f.transpose(0, 1))  # written key by key: no copy to turn it
    absent = (weights.abs().sum(dim=0) == 0).fill_diagonal_(False)  # [query, key]: no weight, T_i(x_j) = 0
    causal = bool(absent.triu(diagonal=1).all())  # a decoder: no query sees a later key
    distance = _distances(by_key, f, diagonal, p.resultant.float(), causal, chunk)  # [key, query]
    # an absent source's distance is ||y_i||_1 exactly (its share 0), not float32's rounding of it
    norm = p.resultant.double().abs().sum(dim=-1, keepdim=True)  # [query, 1]
    summed = merged_context(weights, v) @ w + diagonal  # sum_j T_i(x_j), summed over j before W (linearity)
    return _normalised(p.resultant, torch.where(absent, norm, distance.T)), summed_error(block, summed + p.bias)


def _distances(by_key: torch.Tensor, f: torch.Tensor, diagonal: torch.Tensor, y: torch.Tensor, causal: bool,
               chunk: int) -> torch.Tensor:
    """||y_i - T_i(x_j)||_1 [key, query], T a few keys at a time: by_key [key, query, head], f [key, head, d_model],
    diagonal and y [query, d_model]. A decoder's (causal) chunk skips the queries before its first key: their
    weights on it are 0, and the distance left there is 0 (the caller sets ||y_i||_1)."""
    n, d = y.shape
    distance = torch.zeros(n, n, dtype=y.dtype, device=y.device)  # [key, query]
    step = max(1, chunk // (n * d))
    buffer = torch.empty(step * n * d, dtype=y.dtype, device=y.device)  # one chunk's T - y, reused
    minus_y = -y  # [query, d_model]
    for start in range(0, n, step):
        end, first = min(n, start + step), start if causal else 0
        t = buffer[: (end - start) * (n - first) * d].view(end - start, n - first, d)  # [chunk, query, d_model]
        # T - y in one call: -y_i + [chunk, query, head] @ [chunk, head, d_model] (no separate subtraction pass)
        torch.baddbmm(minus_y[first:].expand(end - start, -1, -1), by_key[start:end, first:], f[start:end], out=t)
        t.diagonal(offset=start - first).add_(diagonal[start:end].T)  # + [i == j] r_i: entries (j - start, j - first)
        torch.sum(t.abs_(), dim=-1, out=distance[start:end, first:])  # ||T_i(x_j) - y_i||_1, written in place
    return distance


def alti(m: Model, inputs: dict[str, torch.Tensor]) -> LayerMixing:
    """ALTI's per-layer contributions for one text (inputs: a tokenizer's tensors, batch of one)."""
    refuse_unsupported(m, "alti", whole_block=True)
    one_text(inputs, "alti")
    blocks = capture_blocks(m, inputs, whole_block=True, dtype=torch.float32)
    matrices, errors = [], []
    for block in blocks:
        matrix, error = layer_alti(block)
        matrices.append(matrix)
        errors.append(error)
    bound = tolerance_for(dtype_name(m.dtype))
    max_error = np.asarray(errors, dtype=np.float64)
    norm = blocks[0].norm
    where = ("residual + attention output" if norm is None else "LayerNorm output" if not norm.sandwich
             else "residual + RMSNorm(attention output)")
    detail = (f"per layer, the transformed vectors plus biases add up to the block's {where} captured from the "
              f"forward pass: max error {float(max_error.max()):.1e} relative to max(1, max |y|), bound {bound:.0e}")
    return LayerMixing("alti", np.stack(matrices), max_error, bound, verdict(max_error, bound), detail, 1)


__all__ = ["CHUNK", "Parts", "alti", "block_error", "contributions", "layer_alti", "parts", "summed_error",
           "transformed_vectors"]
