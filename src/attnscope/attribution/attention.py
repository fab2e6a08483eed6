"""Attention-based attribution, read from the verified trace of the objective's input.

- attention: one layer's weights (default the last), the mean of its heads (or one head), the row of the
  position that predicts the target. Cost: the trace (1 forward and the recompute).
- rollout (Abnar & Zuidema 2020): attnscope.rollout's R after the last layer (or --layer), that row.
- flow (Abnar & Zuidema 2020): attnscope.rollout's max-flow from the top layer, that row; refused past
  --max-flow-tokens (its cost grows like tokens^4).
- attention x gradient: A * dF/dA for one layer (default the last), mean of heads (or one head), that row
  (Serrano & Smith 2019 weigh attention by gradients; Chefer et al. 2021 use A * dA). dF/dA is read through
  the registered attention function: the context a layer returns is kept (capture.intervening, nothing
  changed), its gradient g taken, and dF/dA[h, q, k] = g[q, h] . v[k] since context = A v.
  Cost: 1 forward and T backwards, besides the trace.

Which row: for a causal LM or the encoder-decoder's decoder, the position whose output predicts the target; for
an encoder's pooled embedding (the mean over tokens), the mean of the rows, as mean pooling weighs them.
Check: the trace's check (every stage recomputed from the layer's own weights; PASS within 1e-5 for float32), and
for attention x gradient also the weights of its own forward against the trace's.
"""

from __future__ import annotations

import numpy as np
import torch

from attnscope.attribution.methods import Context
from attnscope.attribution.objective import ENCODER, Objective
from attnscope.attribution.record import Cost, MethodCheck, MethodScores
from attnscope.capture import capturing, intervening
from attnscope.errors import AttnscopeError, validate_index
from attnscope.maths import expand_kv
from attnscope.records.check_report import PASS, TOLERANCE
from attnscope.records.trace import Trace
from attnscope.tracing.one_pass import trace


def trace_of(obj: Objective) -> Trace:
    """The verified trace of the objective's input: of a text that tokenizes to its ids exactly (the text and the
    target's first tokens as written, or the ids decoded: WordPiece drops the space before a target); refused when
    neither does."""
    ids = obj.ids.tolist()
    decoded = str(obj.model.tokenizer.decode(ids, skip_special_tokens=True))
    for text in dict.fromkeys([obj.text, decoded]):
        if obj.model.tokenizer(text, truncation=True, max_length=obj.n_tokens)["input_ids"] == ids:
            tr = trace(text, model=obj.model, max_length=obj.n_tokens)
            if [t.id for t in tr.tokens] == ids:
                return tr
    raise AttnscopeError(f"neither {obj.text!r} nor {decoded!r} tokenizes to the input attributed (the text followed "
                         "by the target's first tokens), so its attention cannot be read from a trace: use a target "
                         "of one token, or a gradient or leave-one-out method", parameter="methods")


def shared_trace(ctx: Context) -> Trace:
    """The verified trace of the objective's input, made once per attribution run (every attention method reads
    it)."""
    if "trace" not in ctx.shared:
        ctx.shared["trace"] = trace_of(ctx.objective)
    tr: Trace = ctx.shared["trace"]
    return tr


def rows(obj: Objective, matrix: np.ndarray) -> np.ndarray:
    """[query, key] -> [target, key]: the predicting positions' rows, or the mean of the rows for an encoder."""
    m = np.asarray(matrix, dtype=np.float64)
    out: np.ndarray = m.mean(axis=0)[None] if obj.kind == ENCODER else m[obj.positions]
    return out


def rolled_rows(obj: Objective, matrices: np.ndarray) -> np.ndarray:
    """rows(obj, the layers' matrices [layer, query, key] rolled out, last @ ... @ first) without the [token,
    token] products: the top layer's chosen rows (or the mean of its rows) times each lower layer's matrix in
    turn, a [target, token] row block at a time (MiniLM at 128 tokens: 5 products of one row instead of 5 of 128;
    the same sums, associated the other way)."""
    top = np.asarray(matrices[-1], dtype=np.float64)
    out: np.ndarray = top.mean(axis=0)[None] if obj.kind == ENCODER else top[obj.positions]
    for layer in range(matrices.shape[0] - 2, -1, -1):
        out = out @ np.asarray(matrices[layer], dtype=np.float64)  # [target, token]
    return out


def trace_check(tr: Trace) -> MethodCheck:
    report = tr.check()
    verified = None if report.status not in (PASS, "FAIL") else report.status == PASS
    detail = (f"the trace's weights recomputed from each layer's q, k and weights ({report.status})"
              if verified is not None else f"NOT VERIFIED: {report.unsupported}")
    return MethodCheck(name="attention recompute", value=report.max_error, bound=report.tolerance,
                       verified=verified, detail=detail)


def layer_of(ctx: Context, n_layers: int) -> int:
    layer = n_layers - 1 if ctx.settings.layer is None else ctx.settings.layer
    validate_index("layer", layer, n_layers, ctx.objective.model.name)
    return layer


def heads_of(ctx: Context, w: np.ndarray) -> np.ndarray:
    """[head, query, key] -> [query, key]: the mean of the heads, or the one asked for."""
    if ctx.settings.head is not None:
        validate_index("head", ctx.settings.head, w.shape[0], ctx.objective.model.name)
    out: np.ndarray = w.mean(axis=0) if ctx.settings.head is None else w[ctx.settings.head]
    return out


def _scores(ctx: Context, name: str, matrix: np.ndarray, unit: str, settings: dict[str, object]) -> MethodScores:
    tr = shared_trace(ctx)
    return MethodScores(method=name, scores=rows(ctx.objective, matrix), unit=unit, check=trace_check(tr),
                        cost=Cost(forwards=1, backwards=0, seconds=0.0), settings=settings)


def raw_attention(ctx: Context) -> MethodScores:
    tr = shared_trace(ctx)
    layer = layer_of(ctx, tr.n_layers)
    head = "mean" if ctx.settings.head is None else ctx.settings.head
    return _scores(ctx, "attention", heads_of(ctx, tr.weights[layer].astype(np.float64)),
                   "attention weight", {"layer": layer, "head": head})


def rollout(ctx: Context) -> MethodScores:
    tr = shared_trace(ctx)
    layer = layer_of(ctx, tr.n_layers)
    return _scores(ctx, "rollout", tr.rollout()[layer], "share of the input (rollout)", {"layer": layer})


def flow(ctx: Context) -> MethodScores:
    n, most = ctx.objective.n_tokens, ctx.settings.max_flow_tokens
    if n > most:
        raise AttnscopeError(f"flow over {n} tokens is beyond its budget of max_flow_tokens={most} tokens (it solves "
                             f"a max-flow for each of the {n}x{n} token pairs; its cost grows like tokens^4): shorten "
                             "the text, or raise max_flow_tokens", parameter="max_flow_tokens")
    tr = shared_trace(ctx)
    return _scores(ctx, "flow", tr.flow(max_tokens=most), "share of the input (max-flow)", {})


class KeepContexts:
    """A capture.Intervention that changes nothing and keeps each call's context [batch, query, head, d_head]."""

    def __init__(self) -> None:
        self.contexts: list[torch.Tensor] = []

    def edit_mask(self, mask: torch.Tensor | None, query: torch.Tensor, module: object = None) -> torch.Tensor | None:
        return mask

    def edit_context(self, context: torch.Tensor) -> torch.Tensor:
        self.contexts.append(context)
        return context


def attention_gradients(obj: Objective, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [head, query, key], dF/dweights [target, head, query, key]) of one layer, one forward."""
    embeds = obj.embed(obj.ids[None].to(obj.model.device)).detach().requires_grad_(True)
    keep = KeepContexts()
    with intervening(obj.model.model, keep), capturing(obj.model.model) as cap:
        f = obj.score_embeds(embeds)[0]  # [target]
    ctx, call = keep.contexts[layer], cap.calls[layer]
    v = expand_kv(call.v, call.weights.shape[1] // call.v.shape[1])[0]  # [head, key, d_head]
    grads = []
    for t in range(obj.n_targets):
        (g,) = torch.autograd.grad(f[t], ctx, retain_graph=t + 1 < obj.n_targets)  # [1, query, head, d_head]
        grads.append(torch.einsum("qhd,hkd->hqk", g[0], v.detach()))  # [head, query, key]
    return call.weights[0].detach(), torch.stack(grads)


def attention_x_gradient(ctx: Context) -> MethodScores:
    obj, tr = ctx.objective, shared_trace(ctx)
    layer = layer_of(ctx, tr.n_layers)
    weights, grads = attention_gradients(obj, layer)
    product = (weights[None] * grads).double().cpu().numpy()  # [target, head, query, key]
    rows_ = np.stack([rows(obj, heads_of(ctx, product[t]))[0 if obj.kind == ENCODER else t]
                      for t in range(obj.n_targets)])  # [target, key]: target t's own row
    check = trace_check(tr)
    drift = float(np.abs(weights.double().cpu().numpy() - tr.weights[layer]).max())
    if drift > TOLERANCE and check.verified is not False:
        check = MethodCheck(name="attention recompute", value=drift, bound=TOLERANCE, verified=False,
                            detail="the weights of the gradient's forward differ from the verified trace's")
    return MethodScores(method="attention_x_gradient", scores=rows_, unit="attention weight x its gradient",
                        check=check, cost=Cost(forwards=2, backwards=obj.n_targets, seconds=0.0),
                        settings={"layer": layer, "head": "mean" if ctx.settings.head is None else ctx.settings.head})
