"""Norm-based attention (Kobayashi et al. 2020): weigh each attention weight by what it moves.

A layer's attention output (before the output bias b_O) is a sum of one vector per head h
and key j:

    output_i - b_O = sum_h sum_j alpha^h_ij f^h(x_j),   f^h(x) = (x W_V^h + b_V^h) W_O^h

with W_O^h the head's d_head rows of the output projection. A large alpha on a key whose
f^h(x_j) is short moves little, so the norms say more than alpha alone:

    norm_head[l, h, i, j]  = ||alpha^h_ij f^h(x_j)|| = alpha^h_ij ||f^h(x_j)||
    norm_layer[l, i, j]    = ||sum_h alpha^h_ij f^h(x_j)||

x W_V^h + b_V^h is the captured `v` stage, so the inputs here are v, the weights and each
layer's W_O in the x @ W convention ([head * d_head, d_model]; GPT-2's Conv1D already is).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

from attnscope.errors import AttnscopeError
from attnscope.rollout import validate_weights


def transformed(v: np.ndarray, w_o: npt.ArrayLike) -> np.ndarray:
    """f^h(x_j) for one layer: v [head, key, d_head], W_O [head * d_head, d_model] -> [head, key, d_model]."""
    v64 = np.asarray(v, dtype=np.float64)
    n_heads, _, d_head = v64.shape
    w = np.asarray(w_o, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != n_heads * d_head:
        raise AttnscopeError(
            f"W_O must be [head * d_head, d_model] = [{n_heads * d_head}, d_model] (x @ W convention), "
            f"got shape {list(w.shape)}"
        )
    w_heads = w.reshape(n_heads, d_head, -1)  # [head, d_head, d_model]: head h owns rows h*d_head..
    f: np.ndarray = np.einsum("hkd,hdm->hkm", v64, w_heads)  # [head, key, d_model]
    return f


def layer_norms(v: np.ndarray, weights: np.ndarray, w_o: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """One layer: v [head, key, d_head], weights [head, query, key] -> ([head, query, key], [query, key])."""
    transformed(v, w_o)  # validates W_O's shape with a clear message
    w = torch.as_tensor(np.asarray(w_o))
    out = norm_attention_batch(torch.as_tensor(v)[None, None], torch.as_tensor(weights)[None, None], [w])
    return out["norm_head"][0, 0].numpy(), out["norm_layer"][0, 0].numpy()


def head_vectors(v: torch.Tensor, w_o: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """f^h(x_j) = v^h_j W_O^h in the tensors' dtype: v [..., head, key, d_head], W_O [head * d_head, d_model] (x @ W)
    -> [..., head, key, d_model]. out: where to write one layer's [head, key, d_model], any strides (norm-based
    attention writes it key by key)."""
    heads, d_head = v.shape[-3], v.shape[-1]
    # W_O read in place: nn.Linear's is a transposed view, whose head blocks BLAS takes as transposed matrices (the
    # same bits as a contiguous copy, and faster without the copy: MiniLM 0.42 vs 0.52 ms, SmolLM2 32 tokens 0.25 vs
    # 0.43 ms, float32, one thread)
    w = w_o.reshape(heads, d_head, -1)  # [head, d_head, d_model]: head h owns rows h*d_head.. (a view where it can be)
    if out is not None:
        return torch.bmm(v.contiguous(), w, out=out)
    return torch.matmul(v.contiguous(), w)


def summed_norms(weights: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """norm_layer: ||sum_h alpha^h_ij f^h(x_j)|| in the tensors' dtype, weights [..., head, query, key] and f
    [..., head, key, d_model] -> [..., query, key]. By the Gram matrix of each key's head vectors,
    ||sum_h a_h f_h||^2 = sum_h,g a_h a_g <f_h, f_g>: [key, head, head] instead of a [query, key, d_model] sum."""
    by_key = f.transpose(-3, -2).contiguous()  # [..., key, head, d_model]
    gram = by_key @ by_key.transpose(-1, -2)  # [..., key, head, head]
    a = weights.movedim(-1, -3).contiguous()  # [..., key, head, query]
    squared = (a * (gram @ a)).sum(dim=-2).transpose(-1, -2)  # [..., key, query] -> [..., query, key]
    # a sum of squares: rounding can leave it a few ulps below 0 where it is 0
    return squared.clamp(min=0.0).sqrt()


@torch.no_grad()
def norm_attention_batch(
    v: torch.Tensor, weights: torch.Tensor, w_o: Sequence[torch.Tensor], dtype: torch.dtype = torch.float64
) -> dict[str, torch.Tensor]:
    """Norm-based attention of a padded batch, computed in dtype (float64 unless told), returned in v's dtype.

    v: [layer, batch, head, key, d_head]; weights: [layer, batch, head, query, key]; w_o: one
    [head * d_head, d_model] per layer. Returns "norm_head" [layer, batch, head, query, key] and
    "norm_layer" [layer, batch, query, key]. Padded keys have weight 0, so their norms are 0.
    """
    heads, layers = [], []
    for i, w in enumerate(w_o):
        alpha = weights[i].to(dtype)  # [batch, head, query, key]
        f = head_vectors(v[i].to(dtype), w.to(dtype))  # [batch, head, key, d_model]
        heads.append(alpha * f.norm(dim=-1)[:, :, None, :])  # alpha_ij ||f(x_j)||
        layers.append(summed_norms(alpha, f))  # [batch, query, key]
    return {"norm_head": torch.stack(heads).to(v.dtype), "norm_layer": torch.stack(layers).to(v.dtype)}


def norm_attention(
    v: np.ndarray, weights: np.ndarray, w_o: Sequence[npt.ArrayLike]
) -> dict[str, np.ndarray]:
    """Norm-based attention for every layer.

    v: [layer, head, token, d_head] (the captured v stage, b_V included);
    weights: [layer, head, query, key]; w_o: one [head * d_head, d_model] per layer (b_O excluded).
    Returns {"norm_head": [layer, head, query, key], "norm_layer": [layer, query, key]} in v's float dtype.
    """
    w = validate_weights(weights)
    v_arr = np.asarray(v)
    if v_arr.ndim != 4 or v_arr.shape[:3] != w.shape[:3]:
        raise AttnscopeError(
            f"v must be [layer, head, token, d_head] matching weights {list(w.shape)}, got {list(v_arr.shape)}"
        )
    if len(w_o) != w.shape[0]:
        raise AttnscopeError(f"need one W_O per layer: {w.shape[0]} layers but {len(w_o)} W_O matrices")
    if not np.isfinite(v_arr).all():
        raise AttnscopeError("v holds NaN or infinity: the trace is broken, trace the text again")
    pairs = [layer_norms(v_arr[i], w[i], w_o[i]) for i in range(w.shape[0])]
    dtype = v_arr.dtype if np.issubdtype(v_arr.dtype, np.floating) else np.dtype(np.float64)
    return {
        "norm_head": np.stack([p[0] for p in pairs]).astype(dtype),  # [layer, head, query, key]
        "norm_layer": np.stack([p[1] for p in pairs]).astype(dtype),  # [layer, query, key]
    }
