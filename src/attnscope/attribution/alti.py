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

How it is computed. The block is first rewritten (parts()) so that every norm's centring and gamma sit in W_O and
its per-query scale is one number per query: T_i(x_j) = s_i sum_h alpha^h_ij f'^h(x_j) + [i == j] r_i (the same
maths as above, reordered), with s_i = 1 / sigma_i (1 / rms_i) of the full sum as the model's own norm received it
(captured), and y_i the block output captured from the forward pass. The kernel multiplies each weight by s_i as it
gathers the weights (the same float32 product as scaling them first, without a [head, query, key] copy). alti() runs
the rewrite itself compiled in one pass per array (kernel_parts: its sums in float64, held to parts() by a test;
MiniLM: 0.41 -> ~0.15 ms a layer inside the forward pass). The distances ||y_i - T_i(x_j)||_1 are then taken by one
compiled kernel (attribution.alti_kernel, numba, its tile LLVM IR in attribution.alti_numba): each T_i(x_j) - y_i
formed in registers, the product over the heads, the difference and the absolute sum in one pass, in float32, the
captured pieces' own precision (c_ij moves by < 1e-5 against the whole tensor in float64: tested on MiniLM and
random GPT-2 and Llama). A decoder's key skips the queries before it (their weights on it are exactly 0, so T = 0
and the distance is ||y_i||_1). transformed_vectors() builds the whole [query, key, d_model] tensor from the same
parts: the walkthrough and the tests read it; alti() does not.
The cost is in the T's themselves: tokens^2 x heads x d_model multiply-adds per layer (at MiniLM's 128 tokens a
third of a forward pass's), plus the absolute sums, fused with them.

The check: per layer, sum_j T_i(x_j) + bias_i equals the block output captured from the real forward pass (the
LayerNorm's output, or what enters the layer's second norm) within tolerance_for(dtype) * max(1, max |y|): float32's
1e-5 relative to the layer's largest output value, since the model itself rounds each value to 2^-24 of its size (a
pre-norm residual stream reaches values in the hundreds). The sum over sources is the kernel's own: each T_i(x_j) it
formed for a distance is added to row i as it goes (float32, key after key; n keys of float32 rounding stay near
n^0.5 * 2^-24 of the sum's size, ~1e-7 of it at MiniLM's 128 tokens), so the check covers the very vectors the
distances read: a dropped residual, a wrong norm scale, a wrong W_O or a head's vectors formed with another head's W'
fails it. Cost: one forward pass of the transformer up to the last layer's attention block (attribution.blocks); no
backward. Each layer is computed inside that forward pass as soon as its block is captured (blocks.map_blocks), so
one layer's captured pieces are alive at a time (SmolLM2 at 512 tokens: +149 MB for the call, not +594 MB).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnscope.attribution.alti_kernel import layer, rewritten
from attnscope.attribution.blocks import LayerBlock, Norm, map_blocks, one_text, refuse_unsupported
from attnscope.attribution.mixing import LayerMixing, normalise_rows, verdict
from attnscope.models import Model
from attnscope.norms import head_vectors
from attnscope.placement import dtype_name
from attnscope.records.check_report import tolerance_for


@dataclass(frozen=True)
class Parts:
    """One layer's block as T_i(x_j) = scale[i] sum_h alpha[h, i, j] (v[h, j] W[h]) + [i == j] diagonal[i]."""

    alpha: torch.Tensor  # [head, query, key]: the attention weights, as captured
    scale: torch.Tensor | None  # [query]: 1 / sigma_i (1 / rms_i) where a norm follows the sum, else None (1)
    v: torch.Tensor  # [head, key, d_head]
    w: torch.Tensor  # [head * d_head, d_model]: W_O, centred over d_model and times gamma where a LayerNorm follows
    diagonal: torch.Tensor  # [query, d_model]: the residual's share, through the norm as the block takes it
    bias: torch.Tensor  # [query, d_model]
    resultant: torch.Tensor  # [query, d_model]: y_i, the block output captured (= sum_j T_i(x_j) + bias_i: checked)

    @property
    def weights(self) -> torch.Tensor:
        """alpha^h_ij scale_i [head, query, key] (the kernel forms the same products as it gathers the weights)."""
        return self.alpha if self.scale is None else self.alpha * self.scale[None, :, None]

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
        return Parts(block.weights, None, block.v, block.w_o, x, block.b_o.expand(x.shape[0], -1),
                     block.block_output)
    full = n.received  # [query, d_model]: the full sum, as the model's norm received it
    spread = _centred(full).pow(2).mean(dim=-1) if n.centred else full.pow(2).mean(dim=-1)  # [query]: var, rms^2
    inv = torch.rsqrt(spread + n.eps)  # [query]: the FULL sum's statistic, one per position
    w_o, b_o = (_centred(block.w_o), _centred(block.b_o)) if n.centred else (block.w_o, block.b_o)
    bias = b_o * n.gamma * inv[:, None] + n.beta  # [query, d_model]
    # sandwich: the residual joins after the norm, untouched
    diagonal = x if n.sandwich else (_centred(x) if n.centred else x) * n.gamma * inv[:, None]
    return Parts(block.weights, inv, block.v, w_o * n.gamma, diagonal, bias, block.block_output)


def kernel_parts(block: LayerBlock) -> Parts:
    """parts(block) in float32 on the CPU, as the kernel reads them, with a norm's rewrite compiled in one pass
    (alti_kernel.rewritten: the same maths, its sums in float64; a test holds it to parts())."""
    n = block.norm
    if n is None:
        return parts(block)
    assert block.residual is not None and block.block_output is not None
    w, diagonal, bias, scale = (t.to(block.v.device) for t in rewritten(  # computed on the CPU; f is the block's
        block.residual, n.received, block.w_o, block.b_o, n.gamma, n.beta, n.eps, n.centred, n.sandwich))
    return Parts(block.weights, scale, block.v, w, diagonal, bias, block.block_output)


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
    max(1, max |y|) with y the captured block output (the difference in the wider of the two dtypes)."""
    assert block.block_output is not None
    y = block.block_output
    scale = max(1.0, float(y.abs().max()))
    return float((summed - y).abs().max()) / scale


def contributions(t: torch.Tensor, bias: torch.Tensor) -> np.ndarray:
    """The paper's c_ij: max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1), rows normalised. [query, key]"""
    y = t.sum(dim=1) + bias  # [query, d_model]
    distance = torch.cdist(y[:, None, :], t, p=1)[:, 0]  # ||y_i - T_i(x_j)||_1: [query, 1, key] -> [query, key]
    return _normalised(y, distance)


def _normalised(y: torch.Tensor, distance: torch.Tensor) -> np.ndarray:
    # ||y_i||_1 = ||y_i - 0||_1, so a source with T_i(x_j) = 0 (a later token) gets exactly 0
    closeness = (y.double().abs().sum(dim=-1, keepdim=True) - distance.double()).clamp(min=0.0)  # the method's clip
    return normalise_rows(closeness.cpu().numpy())


def f_buffer(block: LayerBlock) -> torch.Tensor:
    """Where kernel_f writes one layer's f: [key, head, d_model] float32 on the block's device (alti() makes one per
    text and every layer writes it again)."""
    heads, n, d = block.v.shape[0], block.v.shape[1], block.w_o.shape[-1]
    return torch.empty(n, heads, d, device=block.v.device)


def kernel_f(v: torch.Tensor, w: torch.Tensor, into: torch.Tensor | None = None) -> torch.Tensor:
    """f'^h(x_j) = v^h_j W'^h [head, key, d_model] (v [head, key, d_head], W' [head * d_head, d_model]), stored as
    [key, head, d_model], each key's rows together, as alti_kernel reads it (so it takes f without a copy). into:
    the buffer to write it in (f_buffer), else a new one (also where into does not fit)."""
    heads, n, d = v.shape[0], v.shape[1], w.shape[-1]
    if into is None or into.shape != (n, heads, d) or into.dtype != v.dtype or into.device != v.device:
        into = torch.empty(n, heads, d, dtype=v.dtype, device=v.device)
    return head_vectors(v, w, out=into.transpose(0, 1))


def layer_alti(block: LayerBlock, into: torch.Tensor | None = None) -> tuple[np.ndarray, float]:
    """One layer's contributions c_ij [query, key] and its check's error (summed_error of the T's the distances
    read, summed by the kernel), the distances taken by the compiled kernel in float32 (module doc). into: a buffer
    for f (kernel_f)."""
    p = kernel_parts(block)
    alpha, v, w, diagonal = p.alpha.float(), p.v.float(), p.w.float(), p.diagonal.float()  # as T is built
    scale = None if p.scale is None else p.scale.float()
    f = kernel_f(v, w, into)
    return layer(alpha, f, diagonal, p.resultant.float(), p.bias.float(), scale)  # [query, key], error


def alti(m: Model, inputs: dict[str, torch.Tensor]) -> LayerMixing:
    """ALTI's per-layer contributions for one text (inputs: a tokenizer's tensors, batch of one)."""
    refuse_unsupported(m, "alti", whole_block=True)
    one_text(inputs, "alti")
    into: torch.Tensor | None = None  # f's buffer, made at the first layer and written again by the next
    norm: Norm | None = None  # the first layer's (the text below names the block's output by it)

    def one(block: LayerBlock) -> tuple[np.ndarray, float]:  # each layer as the forward pass captures it
        nonlocal into, norm
        if into is None:
            into, norm = f_buffer(block), block.norm
        return layer_alti(block, into)

    matrices, errors = zip(*map_blocks(m, inputs, whole_block=True, fn=one, dtype=torch.float32), strict=True)
    bound = tolerance_for(dtype_name(m.dtype))
    max_error = np.asarray(errors, dtype=np.float64)
    where = ("residual + attention output" if norm is None else "LayerNorm output" if not norm.sandwich
             else "residual + RMSNorm(attention output)")
    detail = (f"per layer, the transformed vectors plus biases add up to the block's {where} captured from the "
              f"forward pass (the kernel's own sum of the transformed vectors it measured): max error "
              f"{float(max_error.max()):.1e} relative to max(1, max |y|), bound {bound:.0e}")
    return LayerMixing("alti", np.stack(matrices), max_error, bound, verdict(max_error, bound), detail, 1)


__all__ = ["Parts", "alti", "block_error", "contributions", "f_buffer", "kernel_f", "kernel_parts", "layer_alti",
           "parts", "summed_error", "transformed_vectors"]
