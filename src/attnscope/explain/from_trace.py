"""A step-by-step walkthrough of one layer and head, with the model's own numbers.

`walkthrough()` returns data (a list of Steps); `attnscope.explain.render` turns it into text,
Markdown or JSON. Numbers come from the trace's captured arrays; the stages the model
never materialises (scaled, masked, merged) are derived from them with `attnscope.maths`.
"""

from __future__ import annotations

import numpy as np
import torch

from attnscope import maths
from attnscope.explain import rotary
from attnscope.explain import seq2seq as explain_kinds
from attnscope.explain.steps import Step, Walkthrough
from attnscope.models import ModelLike, load_model
from attnscope.numbers import scaling as scaling_text
from attnscope.placement import on_host
from attnscope.records.trace import EncoderDecoderTrace
from attnscope.stages import ARRAY_AXES
from attnscope.tracing.one_pass import Trace
from attnscope.verify.recompute import layer_params

__all__ = ["Step", "Walkthrough", "walkthrough"]  # Step and Walkthrough live in the torch-free attnscope.explain.steps


def walkthrough(tr: Trace | EncoderDecoderTrace, layer: int = 0, head: int = 0, token: int | None = None,
                model: ModelLike | None = None, attention: str | None = None) -> Walkthrough:
    """Build the walkthrough for layer/head (0-indexed); token focuses on one query row.

    An EncoderDecoderTrace: attention chooses "encoder", "decoder" or "cross" (default "cross": each target
    token's attention over the source); model is then the encoder-decoder model it was traced with.
    """
    note = explain_kinds.kind_note(tr, attention)
    tr = explain_kinds.kind_trace(tr, attention)
    tr.validate(layer=layer, head=head, token=token)
    labels = [f"{i}:{t.text}" for i, t in enumerate(tr.tokens)]
    keys = [f"{i}:{t.text}" for i, t in enumerate(tr.keys)]  # the source's for cross-attention
    rows = labels if token is None else [labels[token]]
    sl = slice(None) if token is None else slice(token, token + 1)
    # one layer of each array with a layer axis: [head, ...] or [token, d_model] (flow, [query, key], has none)
    a = {k: tr.arrays[k][layer] for k in tr.arrays if ARRAY_AXES.get(k, ("layer",))[0] == "layer"}
    if "memory" in tr.arrays:
        a["memory"] = tr.arrays["memory"]  # [key, d_model]: every cross-attention layer reads the same
    d_head = int(a["q"].shape[-1])
    p, local = _layer_params(model, layer, tr)  # None without the model, or for a family without a recompute
    steps = [_tokens_step(tr, note), *_x_steps(tr, a, layer, head, labels, keys, p)]
    steps += _weight_steps(tr, p, head, d_head)
    steps += _head_steps(tr, a, head, sl, rows, keys, layer, p, local)
    steps += _merge_steps(tr, a, head, sl, rows, p)
    report = tr.check()
    check = {
        "ok": report.ok,
        "tolerance": report.tolerance,
        "head_max_error": report.head_error(layer, head) if report.comparisons else None,
        "max_error": report.max_error,
        "unsupported": report.unsupported,
    }
    toks = [t.to_dict() for t in tr.tokens]
    key_tokens = None if tr.key_tokens is None else [t.to_dict() for t in tr.key_tokens]
    return Walkthrough(tr.model, layer, head, token, toks, steps, check, tr.attention, key_tokens)


def _tokens_step(tr: Trace, note: str = "") -> Step:
    pair = " A sentence pair: segment 0 is the first text, segment 1 the second." if tr.pair else ""
    text = f"The tokenizer splits the text into {tr.n_tokens} tokens{_pieces_text(tr)}.{pair} Positions are 0-indexed."
    if tr.attention != "self":
        text = f"{explain_kinds.tokens_text(tr)} Positions are 0-indexed.{note}"
    ids = np.asarray([[t.id, t.segment] for t in tr.tokens])
    return Step("tokens", "Tokens", text, f"[token] = [{tr.n_tokens}]", {"id, segment": ids},
                row_labels=[f"{i}:{t.text}" for i, t in enumerate(tr.tokens)], col_labels=["id", "segment"])


def _pieces_text(tr: Trace) -> str:
    """How this tokenizer marks its pieces and which special tokens it added, from the tokens themselves."""
    texts = [t.text for t in tr.tokens if not t.special]
    marks = [("##", "word pieces continuing a word start with ##"),
             ("\u0120", "byte-level pieces: \u0120 stands for the space before a word, \u010a for a line break"),
             ("\u2581", "sentencepiece pieces: \u2581 stands for the space before a word")]
    parts = [what for mark, what in marks if any(mark in t for t in texts)]
    specials = list(dict.fromkeys(t.text for t in tr.tokens if t.special))  # in order, once each
    parts.append(f"special tokens: {', '.join(specials)}" if specials else "no special tokens added")
    return f" ({'; '.join(parts)})"


def _x_steps(tr: Trace, a: dict[str, np.ndarray], layer: int, head: int, labels: list[str], keys: list[str],
             p: maths.AttentionParams | None) -> list[Step]:
    if "x" not in a:
        return []
    if tr.attention != "self":  # an encoder-decoder's: cross-attention's k and v come from the memory
        return explain_kinds.input_steps(tr, a, layer, head, labels, keys, p)
    source = tr.model.get("x_source") or "the hidden state entering this layer"
    n, d = a["x"].shape
    return [Step("x", "The attention input x", f"Where x comes from: {source}.",
                 f"[token, d_model] = [{n}, {d}]", {"x": a["x"]}, row_labels=labels)]


def _layer_params(model: ModelLike | None, layer: int,
                  tr: Trace) -> tuple[maths.AttentionParams | None, list[bool] | None]:
    """The layer's parameters, and which layers of the model slide a window (None when unknown)."""
    if model is None:
        return None, None
    if tr.attention != "self":
        return explain_kinds.kind_params(model, tr.attention, layer), None
    params = layer_params(load_model(model).model, tr.n_tokens)
    if params is None:
        return None, None
    local = [q.window.before is not None for q in params]
    return on_host(params[layer]), local  # float32 on the CPU, as the trace's arrays


def _weight_steps(tr: Trace, p: maths.AttentionParams | None, head: int, d_head: int) -> list[Step]:
    if p is None:
        return []
    cols = slice(head * d_head, (head + 1) * d_head)
    kv = head // p.groups  # grouped-query attention: the k/v head this query head reads
    kv_cols = slice(kv * d_head, (kv + 1) * d_head)  # its columns of W_K and W_V
    arrays = {f"W_{n}[:, {c.start}:{c.stop}]": w[:, c].numpy()
              for n, w, c in (("Q", p.w_q, cols), ("K", p.w_k, kv_cols), ("V", p.w_v, kv_cols))}
    for n, b, c in (("Q", p.b_q, cols), ("K", p.b_k, kv_cols), ("V", p.b_v, kv_cols)):
        if b is not None:
            arrays[f"b_{n}[{c.start}:{c.stop}]"] = b[c].numpy()[None, :]
    d_model = int(p.w_q.shape[0])
    text = (f"Each head owns a slice of the projection matrices: head {head} uses columns "
            f"{cols.start}..{cols.stop - 1} of W_Q, W_K and W_V (d_head = {d_head}).")
    if tr.attention == "cross":
        text += " W_Q multiplies the decoder's x (the queries); W_K and W_V multiply the encoder's memory."
    if p.groups > 1:
        text = (f"Each head owns a slice of W_Q: head {head} uses columns {cols.start}..{cols.stop - 1}. "
                f"{_sharing(p, head)} so its W_K and W_V columns are k/v head {kv}'s, "
                f"{kv_cols.start}..{kv_cols.stop - 1} (d_head = {d_head}).")
    return [Step("projections", f"Head {head}'s slices of W_Q, W_K, W_V", text,
                 f"[d_model, d_head] = [{d_model}, {d_head}]", arrays)]


def _sharing(p: maths.AttentionParams, head: int) -> str:
    """Grouped-query attention in words: which k/v head a query head reads, and who else reads it."""
    kv, groups = head // p.groups, p.groups
    return (f"Grouped-query attention: {p.n_heads} query heads share {p.kv_heads} k/v heads, {groups} each; "
            f"head {head} reads k/v head {kv}, as do query heads {kv * groups}..{(kv + 1) * groups - 1},")


def _sink_text(p: maths.AttentionParams | None, h: int) -> str:
    if p is None or p.sinks is None:
        return ""
    return (f" This family adds an attention sink: one learned logit per head ({float(p.sinks[h]):.4f} for this "
            "head) joins each row's softmax and its share is dropped, so the rows sum to less than 1.")


def _cap_steps(p: maths.AttentionParams | None, capped: np.ndarray, sl: slice, rows: list[str],
               labels: list[str]) -> list[Step]:
    if p is None or p.softcap is None:
        return []
    n = capped.shape[-1]
    text = (f"Logit soft-capping: softcap x tanh(scaled / softcap) with softcap = {p.softcap:g} keeps every score "
            f"inside (-{p.softcap:g}, {p.softcap:g}) and leaves small ones nearly unchanged.")
    return [Step("capped", "Soft-capped scores", text, f"[query, key] = [{n}, {n}]", {"capped": capped[sl]},
                 rows, labels)]


def _mask_text(tr: Trace, p: maths.AttentionParams | None) -> str:
    """What the layer's mask hides, in words: future keys, a sliding or local window, padding."""
    text = ("The causal mask adds -inf (in float32: its most negative number, shown -inf*) to every "
            "key after the query, so a token never sees the future: exp(-inf) = 0 in the softmax."
            if tr.causal else
            "A single unpadded text has nothing to hide: the additive mask is all zeros. "
            "(In a padded batch, padded keys get the most negative float32.)")
    if p is not None and p.window.before is not None and not tr.causal:
        text = (f"This layer is local: a query sees only the keys within {p.window.before} positions of it; "
                "the others get the most negative float32 (exp of it is 0 in the softmax).")
    elif p is not None and p.window.before is not None:
        text += (f" This layer also slides a window: a query sees only the keys at most {p.window.before} "
                 f"positions before it{'' if p.window.after == 0 else f' or {p.window.after} after it'}.")
    return text


def _head_steps(tr: Trace, a: dict[str, np.ndarray], h: int, sl: slice, rows: list[str],
                labels: list[str], layer: int, p: maths.AttentionParams | None = None,
                local: list[bool] | None = None) -> list[Step]:
    n, nk = tr.n_tokens, tr.n_keys  # queries and keys (cross-attention: target and source tokens)
    d_head = int(a["q"].shape[-1])
    s = tr.scaling[layer]
    scores = a["scores"][h]  # [query, key]
    scaled = maths.scale(torch.from_numpy(scores), s).numpy()
    mask = _mask(tr, n, p)
    capped = scaled if p is None or p.softcap is None else maths.soft_cap(torch.from_numpy(scaled), p.softcap).numpy()
    masked = capped + mask + (a["position_bias"][h] if "position_bias" in a else 0.0)  # T5 adds its position bias
    weights = a["weights"][h]
    # grouped-query attention: the k/v head this query head reads, and its row in the trace's k and v (generation
    # files saved before k and v were kept per k/v head hold them per query head, each a copy of its k/v head's)
    row = tr.kv_head(h)
    q, k, v = a["q"][h], a["k"][row], a["v"][row]
    kv = row if p is None else h // p.groups
    shared = f" {_sharing(p, h)} so these are k/v head {kv}'s numbers." if p is not None and p.groups > 1 else ""
    rotated = " (after the rotation above)" if p is not None and p.rope is not None else ""
    scale_text = _scale_text(tr, d_head, s)
    mask_text = explain_kinds.mask_text(tr) if tr.attention == "cross" else _mask_text(tr, p)
    kv_in = "memory" if tr.attention == "cross" else "x"
    sums = weights[sl].sum(axis=-1, keepdims=True)
    return [
        *rotary.qk_norm_steps(tr, a, p, h, sl, rows, labels),
        *rotary.rope_steps(tr, a, p, h, sl, rows, labels, layer, local),
        Step("q", f"Queries Q = x W_Q{rotary.bias_text(p, 'Q')}", f"What each token is looking for{rotated}.",
             f"[token, d_head] = [{n}, {d_head}]", {"q": q[sl]}, rows),
        Step("k", f"Keys K = {kv_in} W_K{rotary.bias_text(p, 'K')}",
             f"What each token offers to be found by{rotated}.{shared}",
             f"[token, d_head] = [{nk}, {d_head}]", {"k": k}, labels),
        Step("v", f"Values V = {kv_in} W_V{rotary.bias_text(p, 'V')}",
             f"What each token passes on when attended to.{shared}",
             f"[token, d_head] = [{nk}, {d_head}]", {"v": v}, labels),
        Step("scores", "Scores = Q K^T", "How well each query matches each key: one dot product per pair.",
             f"[query, key] = [{n}, {nk}]", {"scores": scores[sl]}, rows, labels),
        Step("scaled", "Scaled scores", scale_text, f"[query, key] = [{n}, {nk}]", {"scaled": scaled[sl]},
             rows, labels),
        *_cap_steps(p, capped, sl, rows, labels),
        *explain_kinds.position_bias_step(tr, a, p, h, sl, rows, labels),
        Step("masked", "Mask", mask_text, f"[query, key] = [{n}, {nk}]",
             {"mask": mask[sl], "masked": masked[sl]}, rows, labels),
        Step("weights", "Softmax: the attention weights", "exp(s - max) / sum exp(s - max) along each "
             "row: every row is a probability distribution over keys (row sums shown)." + _sink_text(p, h),
             f"[query, key] = [{n}, {nk}]", {"weights": weights[sl], "row sums": sums}, rows, labels),
        *_weighted_steps(weights, v, a["context"][h], sl, labels),
        Step("context", "Context = weights V", "Each query's output is the weighted average of the "
             "value vectors.", f"[token, d_head] = [{n}, {d_head}]", {"context": a["context"][h][sl]}, rows),
    ]


def _scale_text(tr: Trace, d_head: int, s: float) -> str:
    if tr.model.get("family") == "t5":
        return ("T5 does not divide by sqrt(d_head): its initialisation folds that factor into W_Q, so the scaled "
                "scores equal the scores (x 1).")
    return f"Then {scaling_text(d_head, s)}, which keeps the scores' variance near 1 so the softmax does not saturate."


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


def _merge_steps(tr: Trace, a: dict[str, np.ndarray], h: int, sl: slice, rows: list[str],
                 p: maths.AttentionParams | None = None) -> list[Step]:
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
        steps.append(Step("output", f"Output projection = merged W_O{rotary.bias_text(p, 'O')}",
                          f"One linear map mixes the heads back into the model width; {_after_text(tr)}",
                          f"[token, d_model] = [{n}, {d_model}]",
                          {"output": a["output"][sl]}, rows))
    return steps


def _after_text(tr: Trace) -> str:
    """What follows the attention sublayer: the norm's place depends on the family."""
    pre = tr.model.get("pre_norm")
    if pre is None:
        return "a residual connection (and, depending on the model, a norm) comes after it."
    if pre:
        return ("the residual connection then adds it to the stream the layer read (the norm came before the "
                "attention, on x).")
    return "the residual connection and LayerNorm come after it."


def _mask(tr: Trace, n: int, p: maths.AttentionParams | None = None) -> np.ndarray:
    """The layer's additive mask for one unpadded text: its window (causal, sliding) when the layer is known."""
    if tr.attention == "cross":  # every target token reads every source token
        return np.zeros((n, tr.n_keys), dtype=np.float32)
    if p is not None:
        mask = maths.window_mask(n, p.window)
        return np.zeros((n, n), dtype=np.float32) if mask is None else mask.numpy()
    if tr.causal:
        return maths.causal_mask(n).numpy()
    return np.zeros((n, n), dtype=np.float32)

