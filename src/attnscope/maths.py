"""Scaled dot-product attention from scratch, as pure functions of tensors.

Every function takes and returns plain tensors; nothing here knows about models.
Stage names follow the project vocabulary (attnscope.stages): x, q_pre, k_pre, position_ids,
cos, sin, q, k, v, scores, scaled, capped, masked, weights, context, merged, output.

Why divide by sqrt(d_head)? If the entries of q and k are independent with mean 0
and variance 1, their dot product over d_head terms has variance d_head. Dividing by
sqrt(d_head) brings the scores back to unit variance, so the softmax does not
saturate into a near one-hot distribution with vanishing gradients.

Why rotate q and k (RoPE)? Turning each pair of dimensions (i, i + d_rot/2) of a query at
position m by the angle m theta_i, and of a key at position n by n theta_i, makes their dot
product depend on m - n only: the scores see relative positions without a position embedding.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

import torch

# the mask and position-bias steps live in attnscope.masks; they are part of the taught maths, so re-exported
from attnscope.masks import causal_mask as causal_mask
from attnscope.masks import combine_masks as combine_masks
from attnscope.masks import padding_mask as padding_mask
from attnscope.masks import relative_position_bias as relative_position_bias
from attnscope.masks import relative_position_bucket as relative_position_bucket
from attnscope.masks import window_mask as window_mask
from attnscope.stages import STAGES


@dataclass(frozen=True)
class QKNorm:
    """RMSNorm of the queries or keys before the rotation (QK-norm: Qwen3, OLMo2)."""

    weight: torch.Tensor  # [d_head] when per_head, else [head * d_head]
    eps: float
    per_head: bool  # True: over each head's d_head (Qwen3); False: over the whole projection (OLMo2)


@dataclass(frozen=True)
class Rope:
    """Rotary position embedding: dimension pairs (i, i + d_rot/2) of each head turn by position x theta_i.

    The first d_rot = 2 * len(inv_freq) dimensions of each head rotate; the rest pass unchanged
    (partial rotary, as in GPT-NeoX and Phi).
    """

    inv_freq: torch.Tensor  # [d_rot / 2]: theta_i, after the family's scaling (linear, dynamic, llama3, yarn)
    attention_scaling: float = 1.0  # cos and sin are multiplied by this (YaRN's attention factor)
    kind: str = "default"  # the rope_type the frequencies were computed for

    @property
    def d_rot(self) -> int:
        return 2 * int(self.inv_freq.shape[0])


@dataclass(frozen=True)
class Window:
    """Which keys a query sees: key j is visible from query i when i - before <= j <= i + after.

    None is unlimited. A decoder has after = 0; a sliding window of W keys (Mistral) has
    before = W - 1; a local window of radius r around the query (ModernBERT) has before = after = r.
    """

    before: int | None = None
    after: int | None = None


@dataclass(frozen=True)
class RelativeBias:
    """T5's relative position bias: one learned number per head for each bucket of key - query distances."""

    table: torch.Tensor  # [bucket, head]
    bidirectional: bool  # the encoder's: keys before and after the query get buckets of their own
    max_distance: int  # distances from here on share the last bucket


@dataclass(frozen=True)
class AttentionParams:
    """One attention layer's parameters in the x @ W convention: W is [d_model, n_head * d_head]."""

    w_q: torch.Tensor  # [d_model, head * d_head]
    b_q: torch.Tensor | None  # [head * d_head]
    w_k: torch.Tensor
    b_k: torch.Tensor | None
    w_v: torch.Tensor
    b_v: torch.Tensor | None
    w_o: torch.Tensor  # [head * d_head, d_model]
    b_o: torch.Tensor | None  # [d_model]
    n_heads: int
    scaling: float  # usually 1 / sqrt(d_head); Gemma 2: query_pre_attn_scalar ** -0.5
    n_kv_heads: int | None = None  # grouped-query attention: fewer k/v heads than query heads (None: as many)
    q_norm: QKNorm | None = None
    k_norm: QKNorm | None = None
    rope: Rope | None = None
    softcap: float | None = None  # Gemma 2: scores pass through softcap * tanh(scores / softcap)
    sinks: torch.Tensor | None = None  # [head]: GPT-OSS's attention sinks, one extra logit per head (softmax_with_sink)
    window: Window = Window()  # the keys each query sees (before the padding mask)
    relative_bias: RelativeBias | None = None  # T5: added to the scaled scores (every layer reads the first's)

    @property
    def d_head(self) -> int:
        return int(self.w_q.shape[1]) // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def groups(self) -> int:
        """Query heads per k/v head: query head h reads k/v head h // groups."""
        return self.n_heads // self.kv_heads


def project(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x @ W + b.  [..., token, d_in] x [d_in, d_out] -> [..., token, d_out]

    With a bias and a contiguous x, b + x @ W is one fused call on the rows side by side ([rows, d_in]): the very
    call torch's nn.Linear makes for such an input, so the recompute does what the model did (the same sums as
    x @ W then + b, and as fast within the noise: benchmarks/bench_check_alternatives.py)."""
    if b is not None and x.dim() >= 2 and x.is_contiguous():
        *lead, d_in = x.shape
        return torch.addmm(b, x.reshape(-1, d_in), w).view(*lead, int(w.shape[1]))
    y = x @ w
    return y if b is None else y.add_(b)  # in place on the fresh product: same sum


def split_heads(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[..., token, head * d_head] -> [..., head, token, d_head]"""
    *lead, n_tok, width = t.shape
    return t.reshape(*lead, n_tok, n_heads, width // n_heads).transpose(-3, -2)


def merge_heads(t: torch.Tensor) -> torch.Tensor:
    """[..., head, token, d_head] -> [..., token, head * d_head]"""
    *lead, n_heads, n_tok, d_head = t.shape
    return t.transpose(-3, -2).reshape(*lead, n_tok, n_heads * d_head)


def dot_scores(q: torch.Tensor, k: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """q k^T.  [..., query, d_head] x [..., d_head, key] -> [..., query, key] (into out when given)"""
    return torch.matmul(q, k.transpose(-1, -2), out=out)


def scale(scores: torch.Tensor, scaling: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Multiply by the scaling factor (1 / sqrt(d_head) in the standard case)."""
    return torch.mul(scores, scaling, out=out)


def rms_norm(t: torch.Tensor, norm: QKNorm) -> torch.Tensor:
    """QK-norm: t / sqrt(mean(t^2) + eps) * weight over the last axis.  [..., d] -> [..., d]"""
    return norm.weight * (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + norm.eps))


def rope_tables(positions: torch.Tensor, rope: Rope) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position x theta_i, each angle written twice (for dims i and i + d_rot/2).

    positions: [..., token] -> cos, sin [..., token, d_rot]
    """
    angles = positions[..., None].float() * rope.inv_freq.float()  # [..., token, d_rot / 2]
    both = torch.cat((angles, angles), dim=-1)  # [..., token, d_rot]
    return both.cos() * rope.attention_scaling, both.sin() * rope.attention_scaling


def rotate_half(t: torch.Tensor) -> torch.Tensor:
    """(a, b) -> (-b, a) on the two halves of the last axis: a 90-degree turn of each pair (i, i + d/2)."""
    a, b = t[..., : t.shape[-1] // 2], t[..., t.shape[-1] // 2 :]
    return torch.cat((-b, a), dim=-1)


def rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Turn each pair (t_i, t_{i + d_rot/2}) by its angle: t cos + rotate_half(t) sin on the first d_rot dims.

    t: [..., head, token, d_head]; cos, sin: [token, d_rot] -> [..., head, token, d_head]
    """
    d_rot, half = cos.shape[-1], cos.shape[-1] // 2
    # partial rotary: the dims past d_rot pass unchanged
    out = t * cos if d_rot == t.shape[-1] else torch.cat((t[..., :d_rot] * cos, t[..., d_rot:]), dim=-1)
    # rotate_half(t) sin, half by half and without its cat: (-b) s = -(b s), so the same sums bit for bit
    out[..., :half] -= t[..., half:d_rot] * sin[..., :half]
    out[..., half:d_rot] += t[..., :half] * sin[..., half:]
    return out


def expand_kv(t: torch.Tensor, groups: int) -> torch.Tensor:
    """Grouped-query attention: each k/v head serves `groups` query heads in a row.

    [..., kv_head, token, d_head] -> [..., kv_head * groups, token, d_head]
    """
    return t if groups == 1 else t.repeat_interleave(groups, dim=-3)


def soft_cap(scaled: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(scores / cap): scores stay in (-cap, cap), nearly unchanged when small (Gemma 2)."""
    return torch.tanh(scaled / cap) * cap


def apply_mask(scaled: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Add the additive mask: [..., query, key] + [..., query|1, key]."""
    return scaled if mask is None else scaled + mask


def softmax(masked: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over keys: exp(s - max) / sum exp(s - max), each row sums to 1.

    torch's softmax kernel computes exactly this formula (the row's max, the exp of each score minus it, their
    sum, the division) in one pass over each row, as the models' own eager attention does; a key the mask hid
    (the dtype's minimum) gets exp(minimum - max) = 0, a NaN stays NaN, and a row that sees no key is uniform.
    tests/test_maths.py checks it against those four steps written out. out: where to write it (a buffer that
    multi_head_attention's in-place mode reuses from call to call).
    """
    return torch.softmax(masked, dim=-1, out=out)


def softmax_with_sink(masked: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Softmax over the keys plus one learned logit per head, the sink, whose share is then dropped (GPT-OSS):
    a head can attend to nothing, so its rows sum to less than 1.

    masked: [..., head, query, key]; sinks: [head] -> [..., head, query, key]
    """
    sink = sinks.to(masked.dtype).view(-1, 1, 1).expand(*masked.shape[:-1], 1)  # [..., head, query, 1]
    return softmax(torch.cat((masked, sink), dim=-1))[..., :-1]


def attend(weights: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """weights v.  [..., query, key] x [..., key, d_head] -> [..., query, d_head]"""
    return weights @ v


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
    scaling: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Annotated Transformer's attention(): returns (context, weights).

    q, k, v: [..., token, d_head]; mask: additive, broadcastable to [..., query, key].
    """
    s = 1.0 / math.sqrt(q.shape[-1]) if scaling is None else scaling
    weights = softmax(apply_mask(scale(dot_scores(q, k), s), mask))
    return attend(weights, v), weights


def multi_head_attention(
    x: torch.Tensor, params: AttentionParams, mask: torch.Tensor | None = None,
    positions: torch.Tensor | None = None, keep: Collection[str] | None = None, in_place: bool = False,
    memory: torch.Tensor | None = None, scratch: dict[str, torch.Tensor] | None = None,
    projected: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Every stage of one multi-head attention layer, by name: self-attention, or cross-attention with memory.

    x: [..., token, d_model]; mask: additive, broadcastable to [..., head, query, key] (padding, causal,
    window: see window_mask); positions: [token], 0..n-1 by default (for RoPE).
    Returns x; q_pre, k_pre (before the rotation, after QK-norm) [..., head|kv_head, token, d_head],
    position_ids [token], cos, sin [token, d_rot] when the family rotates; q [..., head, token, d_head];
    k, v [..., kv_head, token, d_head]; scores, scaled, capped (when soft-capped), masked, weights
    [..., head, query, key]; context [..., head, token, d_head]; merged [..., token, head * d_head];
    output [..., token, d_model].
    keep: the stage names to return (default all). in_place=True forms scaled, capped and masked in one
    fresh tensor, step after step, that the softmax then reads (same numbers, less memory): they are not returned.
    scratch (with in_place): a dict in which the scores, that tensor and the weights are kept and reused from
    call to call with the same shapes (a fresh big tensor costs page faults); the scores and weights returned
    then live only until the next such call.
    memory: cross-attention (encoder-decoder models): q from x (the decoder's), k and v from memory (the
    encoder's output) [..., key, d_model]. params.relative_bias (T5) adds position_bias [head, query, key].
    projected: project_qkv's stages of these rows when already formed (the check projects a layer's rows at
    once, one product per projection, and attends a few rows at a time).
    """
    st: dict[str, torch.Tensor] = {"x": x} if memory is None else {"x": x, "memory": memory}
    st.update(project_qkv(x, params, positions, memory) if projected is None else projected)
    k, v = expand_kv(st["k"], params.groups), expand_kv(st["v"], params.groups)  # [..., head, key, d_head]
    reuse = scratch if in_place else None
    logits = _logits(st, k, params, mask, in_place, reuse, keep)  # [..., head, query, key]
    if params.sinks is not None:
        st["weights"] = softmax_with_sink(logits, params.sinks)  # [..., head, query, key], rows sum below 1
    else:
        st["weights"] = softmax(logits, out=_buffer(reuse, "weights", tuple(logits.shape), logits.dtype))
    st["context"] = attend(st["weights"], v)  # [..., head, query, d_head]
    st["merged"] = merge_heads(st["context"])  # [..., query, head * d_head]
    st["output"] = project(st["merged"], params.w_o, params.b_o)  # [..., query, d_model]
    return {name: st[name] for name in STAGES if name in st and (keep is None or name in keep)}


def _logits(st: dict[str, torch.Tensor], k: torch.Tensor, params: AttentionParams, mask: torch.Tensor | None,
            in_place: bool, reuse: dict[str, torch.Tensor] | None, keep: Collection[str] | None) -> torch.Tensor:
    """scores (q k^T with k [..., head, key, d_head]), scaled, capped, biased and masked into st; returns the
    softmax's input. in_place: one buffer rewritten step by step (scaled, capped, masked not kept)."""
    shape = (*st["q"].shape[:-1], int(k.shape[-2]))  # [..., head, query, key]
    # in place and not asked for, the scores are formed in the buffer that their scaling then overwrites
    unkept = in_place and keep is not None and "scores" not in keep
    st["scores"] = dot_scores(st["q"], k, out=_buffer(reuse, "logits" if unkept else "scores", shape, st["q"].dtype))
    logits = _buffer(reuse, "logits", shape, st["q"].dtype)
    if in_place and mask is not None and params.softcap is None and params.relative_bias is None:
        # mask + scaling scores in one pass: the same numbers as scaling then adding, for a mask of 0 and the
        # dtype's minimum (a product rounded once either way, then + 0 or absorbed by the minimum)
        logits, mask = torch.add(mask, st["scores"], alpha=params.scaling, out=logits), None
    else:
        logits = scale(st["scores"], params.scaling, out=logits)
    st["scaled"] = logits
    if params.softcap is not None:
        logits = st["capped"] = soft_cap(logits, params.softcap)
    if params.relative_bias is not None:  # T5: a learned bias per head and query-key distance
        n_query, n_key = int(logits.shape[-2]), int(logits.shape[-1])
        st["position_bias"] = relative_position_bias(n_query, n_key, params.relative_bias)  # [head, query, key]
        logits = logits.add_(st["position_bias"]) if in_place else logits + st["position_bias"]
    if not in_place:
        st["masked"] = apply_mask(logits, mask)
        return st["masked"]
    st.pop("scaled"), st.pop("capped", None)
    return logits if mask is None else logits.add_(mask)  # the same sum as apply_mask, in place


def _buffer(scratch: dict[str, torch.Tensor] | None, name: str, shape: tuple[int, ...],
            dtype: torch.dtype) -> torch.Tensor | None:
    """A tensor of this shape kept in scratch under name, or None without scratch."""
    if scratch is None:
        return None
    key = f"{name} {shape} {dtype}"
    if key not in scratch:
        scratch[key] = torch.empty(shape, dtype=dtype)
    return scratch[key]


def project_qkv(x: torch.Tensor, p: AttentionParams, positions: torch.Tensor | None = None,
                memory: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """q, k, v of one layer: projection, QK-norm, split into heads, rotation (k, v from memory if given).

    Returns q, k, v and, when the family rotates, q_pre, k_pre, position_ids, cos, sin (see multi_head_attention).
    """
    st: dict[str, torch.Tensor] = {}
    kv_in = x if memory is None else memory  # cross-attention: keys and values from the encoder's output
    q, k = project(x, p.w_q, p.b_q), project(kv_in, p.w_k, p.b_k)  # [..., token, head|kv_head * d_head]
    if p.q_norm is not None and not p.q_norm.per_head:
        q = rms_norm(q, p.q_norm)  # OLMo2: over the whole projection, before the split
    if p.k_norm is not None and not p.k_norm.per_head:
        k = rms_norm(k, p.k_norm)
    q, k = split_heads(q, p.n_heads), split_heads(k, p.kv_heads)  # [..., head|kv_head, token, d_head]
    if p.q_norm is not None and p.q_norm.per_head:
        q = rms_norm(q, p.q_norm)  # Qwen3: each head's d_head on its own
    if p.k_norm is not None and p.k_norm.per_head:
        k = rms_norm(k, p.k_norm)
    st["v"] = split_heads(project(kv_in, p.w_v, p.b_v), p.kv_heads)  # [..., kv_head, token, d_head]
    if p.rope is None:
        st["q"], st["k"] = q, k
        return st
    n = int(x.shape[-2])
    pos = torch.arange(n) if positions is None else positions  # [token]
    cos, sin = rope_tables(pos, p.rope)  # [token, d_rot]
    st.update(q_pre=q, k_pre=k, position_ids=pos, cos=cos, sin=sin, q=rotate(q, cos, sin), k=rotate(k, cos, sin))
    return st
