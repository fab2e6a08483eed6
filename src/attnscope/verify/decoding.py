"""Verify a generation, step by step, two ways.

1. "recompute": each step is recomputed from its captured attention input x and the layer's own weights
   with attnscope.maths, using the keys and values the earlier steps captured as the cache (as the model
   does); its q, k, v (new rows), weights, context and output are compared with what the step captured.
2. "no-cache": one forward pass over the final sequence without a cache; every captured row (prompt rows
   of the prefill, one row per later step) is compared with the same row of that pass.
Both are max errors per layer and head, like `attnscope check`, against the same tolerance 1e-5, measured
as |a - b| / max(1, largest |b| of the row): absolute for rows of numbers up to 1 (every weight row),
relative to the row's scale above (see max_error). The no-cache context and output are sums whose two
computations add their terms in other orders: they are measured relative to the size of those terms (_scale).
"""

from __future__ import annotations

import numpy as np
import torch

from attnscope import maths
from attnscope.capture import capturing
from attnscope.families import why_unsupported
from attnscope.models import Model
from attnscope.records.check_report import Comparison
from attnscope.verify.recompute import layer_params

STEP_STAGES = ("q", "k", "v", "weights", "context", "output")
NO_CACHE_STAGES = ("x", "q", "k", "v", "weights", "context", "output")


def step_stages(x: torch.Tensor, p: maths.AttentionParams, k_cache: torch.Tensor, v_cache: torch.Tensor,
                ) -> dict[str, torch.Tensor]:
    """One step's attention from its new rows and the cache: maths.multi_head_attention's steps.

    x: [new, d_model] at positions start .. start + new - 1, where start = k_cache.shape[1];
    k_cache, v_cache: [kv_head, start, d_head], the keys and values of every earlier position (k rotated).
    Returns q of the new rows [head, new, d_head], k and v [kv_head, new, d_head]; weights [head, new, key];
    context [head, new, d_head]; output [new, d_model].
    """
    start, new = int(k_cache.shape[1]), int(x.shape[0])
    # projection, QK-norm, heads and rotation at the rows' own positions: the taught path's first steps
    st = maths.project_qkv(x, p, torch.arange(start, start + new))
    # the cache, then the new rows; each query head reads its k/v head's ([head, key, d_head])
    keys = maths.expand_kv(torch.cat([k_cache, st["k"]], dim=1), p.groups)
    values = maths.expand_kv(torch.cat([v_cache, st["v"]], dim=1), p.groups)
    logits = maths.scale(maths.dot_scores(st["q"], keys), p.scaling)  # [head, new, key]
    if p.softcap is not None:
        logits = maths.soft_cap(logits, p.softcap)
    window = maths.window_mask(start + new, p.window)  # [query, key] over the whole sequence so far
    masked = maths.apply_mask(logits, None if window is None else window[start:])
    weights = maths.softmax(masked) if p.sinks is None else maths.softmax_with_sink(masked, p.sinks)  # GPT-OSS
    context = maths.attend(weights, values)  # [head, new, d_head]
    output = maths.project(maths.merge_heads(context), p.w_o, p.b_o)  # [new, d_model]
    return {"q": st["q"], "k": st["k"], "v": st["v"], "weights": weights, "context": context, "output": output}


def row_spans(prompt_length: int, n_steps: int) -> list[slice]:
    """The rows each step computed: the whole prompt for step 0, then one row per step."""
    return [slice(0, prompt_length)] + [slice(prompt_length + s - 1, prompt_length + s) for s in range(1, n_steps)]


@torch.no_grad()
def recompute_steps(layers: dict[str, list[torch.Tensor]], p: maths.AttentionParams, layer: int,
                    spans: list[slice]) -> dict[str, torch.Tensor]:
    """Every step of one layer recomputed, laid out like the captured rows: stage -> [1, ...]."""
    k_all, v_all = layers["k"][layer][0], layers["v"][layer][0]  # [kv_head, token, d_head]: the captured cache
    n_rows = int(layers["x"][layer].shape[1])
    parts: dict[str, list[torch.Tensor]] = {s: [] for s in STEP_STAGES}
    weights = torch.zeros(p.n_heads, n_rows, n_rows)  # [head, query, key]
    for span in spans:
        rec = step_stages(layers["x"][layer][0, span], p, k_all[:, : span.start], v_all[:, : span.start])
        weights[:, span, : span.stop] = rec.pop("weights")
        for stage, t in rec.items():
            parts[stage].append(t)
    out = {s: torch.cat(ts, dim=-2)[None] for s, ts in parts.items() if s != "weights"}
    out["weights"] = weights[None]
    return out


def verify_generation(m: Model, layers: dict[str, list[torch.Tensor]], ids: torch.Tensor, prompt_length: int,
                      n_steps: int) -> tuple[list[Comparison], str | None]:
    """Both comparisons of a generation; returns (comparisons, why the recompute did not run, if it did not).

    layers: the captured rows (attnscope.tracing.decoding.assemble); ids: [1, token] the sequence the steps read.
    """
    errors: dict[tuple[str, str], list[np.ndarray]] = {}  # one [head] or [1] per layer
    params = layer_params(m.model, int(ids.shape[1]) + 1)  # the rotation for the whole sequence
    unsupported = None
    if params is None:
        unsupported = why_unsupported(m.model) or f"independent recompute not supported for {m.architecture}"
    else:
        spans = row_spans(prompt_length, n_steps)
        for layer, p in enumerate(params):
            rec = recompute_steps(layers, p, layer, spans)
            for stage in STEP_STAGES:
                errors.setdefault((stage, "recompute"), []).append(max_error(layers[stage][layer], rec[stage]))
    full = no_cache_forward(m, ids)
    for stage in NO_CACHE_STAGES:
        errors[(stage, "no-cache")] = [
            max_error(layers[stage][layer], full[stage][layer], _scale(stage, full, layer, params))
            for layer in range(len(full[stage]))]
    heads = int(layers["q"][0].shape[1])
    for (stage, _), errs in errors.items():
        if stage in ("k", "v"):  # [kv_head] -> [head]: an error counts for every query head that reads it
            errs[:] = [np.repeat(e, heads // len(e)) for e in errs]
    return [Comparison(st, src, np.stack(errs), relative=True) for (st, src), errs in errors.items()], unsupported


def max_error(captured: torch.Tensor, other: torch.Tensor, scale: torch.Tensor | None = None) -> np.ndarray:
    """|a - b| / scale: the max per head ([head] for [1, head, token, width]) or over all ([1] for
    [1, token, d_model]). scale (broadcast to the arrays) defaults to max(1, the row's largest |b|), a row being
    one token's vector (a head's q, k, v or context; x; output) or one query's weights.

    Absolute for rows of numbers up to 1 (every weight), relative to the row's scale above: float32 resolves
    1.5e-5 at 181 (SmolLM2's largest attention outputs), so no two float32 computations of a row holding such
    numbers agree within an absolute 1e-5. NaN stays NaN.
    """
    a, b = captured.float(), other.float()
    if scale is None:
        scale = b.abs().amax(dim=-1, keepdim=True).clamp_(min=1.0)  # [..., token, 1]
    diff = (a - b).abs_().div_(scale)
    if diff.dim() == 4:  # [1, head, token, ...]
        return diff[0].flatten(1).amax(1).numpy().astype(np.float64)
    return diff.amax().reshape(1).numpy().astype(np.float64)


def _scale(stage: str, full: dict[str, list[torch.Tensor]], layer: int,
           params: list[maths.AttentionParams] | None) -> torch.Tensor | None:
    """The no-cache comparison's scale for a sum: what float32 rounding of that sum is proportional to.

    A cached and an uncached forward pass add the same products in different orders (other matrix shapes,
    other kernels), so their sums differ by rounding that grows with the sum of the |terms|, not with |the sum|:
    - context_t = sum_k w_tk v_k: its terms are at most max |v_k| (the weights sum to 1), so the scale is
      max(1, the largest |v| among the keys row t reads) [1, head, token, 1];
    - output_tj = sum_i merged_ti W_O[i, j]: its terms sum to at most |merged_t| |W_O[:, j]| (Cauchy-Schwarz),
      the scale `attnscope check` uses for the output too [1, token, d_model].
    - q, k, v = x W (+ b), per element j: terms at most |x_t| |W[:, j]| (+ |b_j|); a rotation (RoPE) mixes two
      elements of a head, so q and k take twice the largest of their head's [1, head, token, 1]. After a
      QK-norm, q and k keep the row's scale.
    Every other stage (x, weights): the row's largest |b| (max_error's default). A difference of 1e-5 of these
    scales, far above float32's 1.2e-7 per rounding, is still a failure.
    """
    if stage in ("q", "k", "v") and params is not None:
        return _projection_scale(stage, full["x"][layer], params[layer])
    if stage == "context":
        v = full["v"][layer].float().abs().amax(dim=-1)  # [1, kv_head, key]
        seen = torch.cummax(v, dim=-1).values  # [1, kv_head, token]: over the keys 0..t each row reads
        seen = maths.expand_kv(seen[..., None], int(full["q"][layer].shape[1]) // int(v.shape[1]))
        return seen.clamp_(min=1.0)  # [1, head, token, 1]
    if stage == "output" and params is not None:
        context = full["context"][layer].float()  # [1, head, token, d_head]
        merged = context.transpose(1, 2).flatten(2).norm(dim=-1, keepdim=True)  # [1, token, 1]
        scale: torch.Tensor = (merged * params[layer].w_o.float().norm(dim=0)).clamp_(min=1.0)
        return scale  # [1, token, d_model]
    return None


def _projection_scale(stage: str, x: torch.Tensor, p: maths.AttentionParams) -> torch.Tensor | None:
    """|x_t| |W[:, j]| + |b_j| split into heads [1, head|kv_head, token, d_head] (see _scale); None after a QK-norm."""
    w, b, norm = {"q": (p.w_q, p.b_q, p.q_norm), "k": (p.w_k, p.b_k, p.k_norm), "v": (p.w_v, p.b_v, None)}[stage]
    if norm is not None:
        return None
    heads = p.n_heads if stage == "q" else p.kv_heads
    size = x.float().norm(dim=-1, keepdim=True) * w.float().norm(dim=0)  # [1, token, head * d_head]
    if b is not None:
        size = size + b.float().abs()
    size = maths.split_heads(size, heads)  # [1, head, token, d_head]
    if stage != "v" and p.rope is not None:  # a rotated element holds terms of two columns of its head
        size = 2 * size.amax(dim=-1, keepdim=True)
    scale: torch.Tensor = size.clamp_(min=1.0)
    return scale


@torch.no_grad()
def no_cache_forward(m: Model, ids: torch.Tensor) -> dict[str, list[torch.Tensor]]:
    """One forward pass over ids [1, token] without a cache: stage -> [1, ...] per layer."""
    with capturing(m.model) as cap:
        m.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    out: dict[str, list[torch.Tensor]] = {"x": cap.x, "output": cap.output}
    for stage in ("q", "k", "v", "weights", "context"):
        out[stage] = [getattr(c, stage) for c in cap.calls]  # [1, head|kv_head, token, ...]
    return out


__all__ = ["no_cache_forward", "recompute_steps", "row_spans", "step_stages", "verify_generation"]
