"""A step-by-step walkthrough of one layer and head, with the model's own numbers.

`walkthrough()` returns data (a list of Steps); `attnscope.render` turns it into text,
Markdown or JSON. Numbers come from the trace's captured arrays; the stages the model
never materialises (scaled, masked, merged) are derived from them with `attnscope.maths`.
"""

from __future__ import annotations

import numpy as np
import torch

from attnscope import maths
from attnscope.models import ModelLike, load_model
from attnscope.numbers import scaling as scaling_text
from attnscope.recompute import layer_params
from attnscope.steps import Step, Walkthrough
from attnscope.tracing import Trace

__all__ = ["Step", "Walkthrough", "walkthrough"]  # Step and Walkthrough live in the torch-free attnscope.steps


def walkthrough(tr: Trace, layer: int = 0, head: int = 0, token: int | None = None,
                model: ModelLike | None = None) -> Walkthrough:
    """Build the walkthrough for layer/head (0-indexed); token focuses on one query row."""
    tr.validate(layer=layer, head=head, token=token)
    labels = [f"{i}:{t.text}" for i, t in enumerate(tr.tokens)]
    rows = labels if token is None else [labels[token]]
    sl = slice(None) if token is None else slice(token, token + 1)
    a = {k: v[layer] for k, v in tr.arrays.items()}  # one layer: [head, ...] or [token, d_model]
    d_head = int(a["q"].shape[-1])
    steps = [_tokens_step(tr), *_x_steps(tr, a, labels)]
    steps += _weight_steps(tr, model, layer, head, d_head)
    steps += _head_steps(tr, a, head, sl, rows, labels, layer)
    steps += _merge_steps(tr, a, head, sl, rows)
    report = tr.check()
    check = {
        "ok": report.ok,
        "tolerance": report.tolerance,
        "head_max_error": report.head_error(layer, head) if report.comparisons else None,
        "max_error": report.max_error,
        "unsupported": report.unsupported,
    }
    toks = [t.to_dict() for t in tr.tokens]
    return Walkthrough(tr.model, layer, head, token, toks, steps, check)


def _tokens_step(tr: Trace) -> Step:
    pair = " A sentence pair: segment 0 is the first text, segment 1 the second." if tr.pair else ""
    text = (f"The tokenizer splits the text into {tr.n_tokens} tokens (word pieces marked ##, "
            f"special tokens in brackets).{pair} Positions are 0-indexed.")
    ids = np.asarray([[t.id, t.segment] for t in tr.tokens])
    return Step("tokens", "Tokens", text, f"[token] = [{tr.n_tokens}]", {"id, segment": ids},
                row_labels=[f"{i}:{t.text}" for i, t in enumerate(tr.tokens)], col_labels=["id", "segment"])


def _x_steps(tr: Trace, a: dict[str, np.ndarray], labels: list[str]) -> list[Step]:
    if "x" not in a:
        return []
    source = tr.model.get("x_source") or "the hidden state entering this layer"
    n, d = a["x"].shape
    return [Step("x", "The attention input x", f"Where x comes from: {source}.",
                 f"[token, d_model] = [{n}, {d}]", {"x": a["x"]}, row_labels=labels)]


def _weight_steps(tr: Trace, model: ModelLike | None, layer: int, head: int, d_head: int) -> list[Step]:
    if model is None:
        return []
    m = load_model(model)
    params = layer_params(m.model)
    if params is None:
        return []
    p = params[layer]
    cols = slice(head * d_head, (head + 1) * d_head)
    arrays = {f"W_{n}[:, {cols.start}:{cols.stop}]": w[:, cols].numpy()
              for n, w in (("Q", p.w_q), ("K", p.w_k), ("V", p.w_v))}
    for n, b in (("Q", p.b_q), ("K", p.b_k), ("V", p.b_v)):
        if b is not None:
            arrays[f"b_{n}[{cols.start}:{cols.stop}]"] = b[cols].numpy()[None, :]
    d_model = int(p.w_q.shape[0])
    text = (f"Each head owns a slice of the projection matrices: head {head} uses columns "
            f"{cols.start}..{cols.stop - 1} of W_Q, W_K and W_V (d_head = {d_head}).")
    return [Step("projections", f"Head {head}'s slices of W_Q, W_K, W_V", text,
                 f"[d_model, d_head] = [{d_model}, {d_head}]", arrays)]


def _head_steps(tr: Trace, a: dict[str, np.ndarray], h: int, sl: slice, rows: list[str],
                labels: list[str], layer: int) -> list[Step]:
    n = tr.n_tokens
    d_head = int(a["q"].shape[-1])
    s = tr.scaling[layer]
    scores = a["scores"][h]  # [query, key]
    scaled = maths.scale(torch.from_numpy(scores), s).numpy()
    mask = _mask(tr, n)
    masked = scaled + mask
    weights = a["weights"][h]
    q, k, v = a["q"][h], a["k"][h], a["v"][h]
    scale_text = scaling_text(d_head, s)
    mask_text = ("The causal mask adds -inf (in float32: its most negative number, shown -inf*) to every "
                 "key after the query, so a token never sees the future: exp(-inf) = 0 in the softmax."
                 if tr.causal else
                 "A single unpadded text has nothing to hide: the additive mask is all zeros. "
                 "(In a padded batch, padded keys get the most negative float32.)")
    sums = weights[sl].sum(axis=-1, keepdims=True)
    return [
        Step("q", "Queries Q = x W_Q + b_Q", "What each token is looking for.",
             f"[token, d_head] = [{n}, {d_head}]", {"q": q[sl]}, rows),
        Step("k", "Keys K = x W_K + b_K", "What each token offers to be found by.",
             f"[token, d_head] = [{n}, {d_head}]", {"k": k}, labels),
        Step("v", "Values V = x W_V + b_V", "What each token passes on when attended to.",
             f"[token, d_head] = [{n}, {d_head}]", {"v": v}, labels),
        Step("scores", "Scores = Q K^T", "How well each query matches each key: one dot product per pair.",
             f"[query, key] = [{n}, {n}]", {"scores": scores[sl]}, rows, labels),
        Step("scaled", "Scaled scores", f"Then {scale_text}, which keeps the scores' variance near 1 "
             "so the softmax does not saturate.", f"[query, key] = [{n}, {n}]", {"scaled": scaled[sl]},
             rows, labels),
        Step("masked", "Mask", mask_text, f"[query, key] = [{n}, {n}]",
             {"mask": mask[sl], "masked": masked[sl]}, rows, labels),
        Step("weights", "Softmax: the attention weights", "exp(s - max) / sum exp(s - max) along each "
             "row: every row is a probability distribution over keys (row sums shown).",
             f"[query, key] = [{n}, {n}]", {"weights": weights[sl], "row sums": sums}, rows, labels),
        *_weighted_steps(weights, v, a["context"][h], sl, labels),
        Step("context", "Context = weights V", "Each query's output is the weighted average of the "
             "value vectors.", f"[token, d_head] = [{n}, {d_head}]", {"context": a["context"][h][sl]}, rows),
    ]


def _weighted_steps(weights: np.ndarray, v: np.ndarray, context: np.ndarray, sl: slice,
                    labels: list[str]) -> list[Step]:
    """For one focused query: each value row times its weight, and their sum (the context row)."""
    if sl.start is None:
        return []
    t = int(sl.start)
    weighted = weights[t][:, None] * v  # [key, d_head]: weight_tj times value row j
    total = weighted.sum(axis=0, dtype=np.float64)[None, :]  # [1, d_head]
    diff = float(np.abs(total - context[t].astype(np.float64)).max())
    text = (f"Query {t}'s context, broken down: row j is weight[{t}, j] x v_j; their sum is the context row "
            f"(it equals the model's own context within float32 rounding: max difference {diff:.1e}).")
    n, d_head = v.shape
    return [Step("weighted", "Weighted values: weight x value, then their sum", text,
                 f"[key, d_head] = [{n}, {d_head}]",
                 {f"weight[{t}, j] x v_j": weighted, "sum over keys": total},
                 labels[:n] if n == len(labels) else None)]


def _merge_steps(tr: Trace, a: dict[str, np.ndarray], h: int, sl: slice, rows: list[str]) -> list[Step]:
    n_heads, n, d_head = a["context"].shape
    merged = maths.merge_heads(torch.from_numpy(a["context"])).numpy()  # [token, head * d_head]
    cols = list(range(h * d_head, (h + 1) * d_head))
    text = (f"The {n_heads} heads' contexts are concatenated side by side: head {h} fills columns "
            f"{cols[0]}..{cols[-1]} (shown first, then the whole row).")
    arrays = {f"merged[:, {cols[0]}:{cols[-1] + 1}] (head {h})": merged[sl][:, cols[0]:cols[-1] + 1],
              "merged": merged[sl]}
    steps = [Step("merged", "Concatenate the heads", text, f"[token, head * d_head] = [{n}, {n_heads * d_head}]",
                  arrays, rows, [str(c) for c in cols])]
    if "output" in a:
        d_model = a["output"].shape[-1]
        steps.append(Step("output", "Output projection = merged W_O + b_O",
                          "One linear map mixes the heads back into the model width; the residual "
                          "connection and LayerNorm come after it.", f"[token, d_model] = [{n}, {d_model}]",
                          {"output": a["output"][sl]}, rows))
    return steps


def _mask(tr: Trace, n: int) -> np.ndarray:
    if tr.causal:
        return maths.causal_mask(n).numpy()
    return np.zeros((n, n), dtype=np.float32)

