"""The walkthrough's steps before the scores in the families that normalise and rotate q and k: QK-norm (Qwen3,
OLMo2, Gemma 3) and RoPE, with the layer's own base where local and global layers differ (Gemma 3)."""

from __future__ import annotations

import numpy as np
import torch

from attnscope import maths
from attnscope.explain.steps import Step
from attnscope.families.adapters import FAMILIES
from attnscope.records.trace import Trace


def bias_text(p: maths.AttentionParams | None, name: str) -> str:
    """" + b_Q" when the layer has that bias, or when its parameters are not at hand; "" for a bias-free layer."""
    bias = None if p is None else {"Q": p.b_q, "K": p.b_k, "V": p.b_v, "O": p.b_o}[name]
    return f" + b_{name}" if p is None or bias is not None else ""


def qk_norm_steps(tr: Trace, a: dict[str, np.ndarray], p: maths.AttentionParams | None, h: int, sl: slice,
                  rows: list[str], labels: list[str]) -> list[Step]:
    """QK-norm with the layer's numbers: x W_Q, its root mean square, the norm's scale g, and q normalised."""
    if p is None or p.q_norm is None or "x" not in a or tr.attention == "cross":
        return []
    norm, d = p.q_norm, p.d_head
    raw = maths.project(torch.from_numpy(a["x"]), p.w_q, p.b_q)  # [token, head * d_head]
    if norm.per_head:  # Qwen3, Gemma 3: each head's d_head on its own
        head_raw = maths.split_heads(raw, p.n_heads)[h]  # [token, d_head]
        rms = torch.sqrt(head_raw.pow(2).mean(-1, keepdim=True) + norm.eps)  # [token, 1]
        normed, scale, over = maths.rms_norm(head_raw, norm), norm.weight, "each head's d_head values"
    else:  # OLMo2: the whole projection, then the split
        rms = torch.sqrt(raw.pow(2).mean(-1, keepdim=True) + norm.eps)
        normed = maths.split_heads(maths.rms_norm(raw, norm), p.n_heads)[h]
        head_raw, scale, over = raw[:, h * d:(h + 1) * d], norm.weight[h * d:(h + 1) * d], "the whole projection"
    used = normed  # what the attention receives: normed, then rotated where the family rotates
    if p.rope is not None:
        used = maths.rotate(normed, *maths.rope_tables(torch.arange(int(normed.shape[0])), p.rope))
    diff = float((used - torch.from_numpy(a["q"][h])).abs().max())  # against the q the model's attention got
    family = FAMILIES.get(str(tr.model.get("family")))
    stored = " (the model stores w and scales by g = 1 + w)" if family is not None and family.unit_offset else ""
    rotated = ", once rotated," if p.rope is not None else ""
    text = (f"QK-norm: before the rotation, q (and k, alike with its own g) is divided by its root mean square over "
            f"{over}, sqrt(mean(q^2) + eps) with eps = {norm.eps:g}, then scaled by the learned g{stored}: the "
            f"scores' size no longer grows with x's. This q{rotated} matches the q the model's attention received "
            f"within {diff:.1e}.")
    return [Step("qk_norm", "QK-norm: q and k normalised by their root mean square", text,
                 f"[token, d_head] = [{tr.n_tokens}, {d}]",
                 {"x W_Q (head slice)": head_raw[sl].numpy(), "rms": rms[sl].numpy(), "g": scale[None].numpy(),
                  "q normalised": normed[sl].numpy()}, rows if sl.start is not None else labels,
                 array_labels={"g": (["g"], None)})]


def _base_text(rope: maths.Rope, layer: int, local: list[bool] | None) -> str:
    """Which layers are local and global where the model has both, and this layer's base."""
    if local is None or all(local) or not any(local):
        return ""
    kind = "local (a sliding window)" if local[layer] else "global (every earlier key)"
    spans = {flag: _ranges([i for i, f in enumerate(local) if f == flag]) for flag in (True, False)}
    base = ""
    if rope.kind == "default" and rope.inv_freq.shape[0] > 1:  # theta_i = base^(-2i / d_rot)
        value = float(f"{float(rope.inv_freq[1].double()) ** (-rope.d_rot / 2):.4g}")  # float32 theta: 4 digits
        base = f"; its rotation's base is {value:,.0f} (theta_i = base^(-2i/d_rot))"
    return (f" Layer {layer} is {kind}{base}. This model's local layers are {spans[True]}, its global layers "
            f"{spans[False]}: each kind turns with its own base.")


def _ranges(layers: list[int]) -> str:
    """[0, 1, 2, 4] -> "0-2, 4"."""
    out: list[str] = []
    for i in layers:
        if out and int(out[-1].split("-")[-1]) == i - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ", ".join(out)


def rope_steps(tr: Trace, a: dict[str, np.ndarray], p: maths.AttentionParams | None, h: int, sl: slice,
               rows: list[str], labels: list[str], layer: int = 0, local: list[bool] | None = None) -> list[Step]:
    """The rotation (RoPE): q and k before and after, and one pair of dimensions turned by position x theta_i;
    local: which layers of the model slide a window (Gemma 3's local and global layers turn with their own base)."""
    if p is None or p.rope is None or "x" not in a:
        return []
    kv = h // p.groups  # k_pre below is the layer's own, one per k/v head
    st = maths.project_qkv(torch.from_numpy(a["x"]), p)  # q_pre, k_pre, cos, sin, q, k: no [head, query, key] work
    q_pre, k_pre, q = st["q_pre"][h].numpy(), st["k_pre"][kv].numpy(), st["q"][h].numpy()
    diff = float(np.abs(q - a["q"][h]).max())  # the rotation recomputed here vs the q the model used
    d_rot, theta = p.rope.d_rot, p.rope.inv_freq.double().numpy()  # [d_rot / 2]
    t = int(sl.start) if sl.start is not None else min(tr.n_tokens - 1, 3)
    half = d_rot // 2
    pair = np.asarray([[i, i + half, t, t * theta[i], q_pre[t, i], q_pre[t, i + half], q[t, i], q[t, i + half]]
                       for i in range(min(4, half))])  # [pair, 8]: the first pairs of token t
    partial = "" if d_rot == q.shape[-1] else f" Only the first {d_rot} of {q.shape[-1]} dims rotate (partial rotary)."
    text = (f"RoPE ({p.rope.kind}): dims i and j = i + {d_rot // 2} of each head's q and k form a pair, turned by the "
            f"angle position x theta_i, theta_i = {theta[0]:.4g}, {theta[min(1, len(theta) - 1)]:.4g}, ... "
            f"{theta[-1]:.4g} (i = 0..{half - 1}: fast turns first, slow last). (a, b) = (q_i, q_j) becomes "
            f"(a cos - b sin, "
            f"a sin + b cos), so q_m . k_n depends on m - n only: positions enter the scores here, not through x."
            f"{partial}{_base_text(p.rope, layer, local)} The rows below turn the first pairs of q for token {t}. "
            f"The rotated q matches the model's within {diff:.1e}.")
    d = int(q.shape[-1])
    scaled = p.rope.attention_scaling
    factor = f" Both are multiplied by the attention factor {scaled:.4g}." if scaled != 1.0 else ""
    return [
        Step("q_pre", "q and k before the rotation",
             f"x W_Q{bias_text(p, 'Q')} and x W_K{bias_text(p, 'K')} (after QK-norm where the family has it), split "
             "into heads.", f"[token, d_head] = [{tr.n_tokens}, {d}]",
             {"q_pre": q_pre[sl], f"k_pre (k/v head {kv})": k_pre}, rows if sl.start is not None else labels),
        Step("cos", "The rotation's tables: cos and sin of position x theta_i", "Row m is position m; column i "
             f"and i + {half} hold the same angle (each pair turns as one).{factor}",
             f"[token, d_rot] = [{tr.n_tokens}, {d_rot}]", {"cos": st["cos"].numpy(), "sin": st["sin"].numpy()}),
        Step("rope", "Rotate q and k by position (RoPE)", text, f"[pair, 8] = [{len(pair)}, 8]",
             {f"q of token {t}, pair by pair": pair}, None,
             ["i", "j", "position", "angle (rad)", "q_i", "q_j", "rotated q_i", "rotated q_j"],
             integer_cols=("i", "j", "position")),
    ]
