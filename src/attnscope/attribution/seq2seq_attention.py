"""Attention-based attribution for encoder-decoders (T5, BART, mBART, Marian): raw attention, rollout and
attention x gradient over the source and the target, read from the verified trace of the objective's own ids.

An encoder-decoder mixes tokens through three kinds of attention: the encoder's self-attention over the source,
the decoder's causal self-attention over its input, and cross-attention from each decoder position to the
encoder's output. The scored sequence is the source's tokens, then the decoder input's (attribution.objective);
target t is predicted at decoder position t. Layers are the decoder's (0-indexed; default the last).

- attention: decoder position t's cross-attention row over the source beside its self-attention row over the
  decoder input, in one layer (mean of heads, or --head): two distributions, each summing to 1 on its side.
- rollout: the encoder's rollout (Abnar & Zuidema 2020: R_enc = prod over encoder layers of 0.5 A + 0.5 I, heads
  averaged), then through the decoder up to the layer asked for, with M [decoder position, source + decoder
  input] starting at [0 | I] and per decoder layer
      self-attention:   M <- (0.5 A_self + 0.5 I) M
      cross-attention:  M <- 0.5 M + 0.5 A_cross [R_enc | 0]
  the half residual of Abnar & Zuidema on each sub-layer, and the cross-attention reading the encoder's rolled
  output (Chefer, Gur & Wolf 2021's encoder-decoder rule, R^ts += A^ts R^ss, as a rollout): every row stays a
  distribution over the source and target tokens, summing to 1.
- attention x gradient: A * dF/dA of one decoder layer's cross-attention (the source side) and self-attention
  (the target side), mean of heads or --head; dF/dA read through the registered attention function as for a
  decoder (attribution.attention). Cost: 1 F + T B besides the trace.
- flow does not apply: attention flow is a max-flow over one stack's layered graph (Abnar & Zuidema 2020), and
  the encoder's output feeds every decoder layer at once; use rollout.

Check: the trace's three kinds (encoder, decoder, cross), every stage recomputed from each layer's own weights
(PASS within 1e-5 for float32); attention x gradient also compares the weights of its own forward with the
trace's.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from attnscope import families
from attnscope.attribution.attention import KeepContexts, heads_of, layer_of
from attnscope.attribution.methods import Context
from attnscope.attribution.objective import Objective
from attnscope.attribution.record import Cost, MethodCheck, MethodScores
from attnscope.capture import AttentionCall, capturing, intervening
from attnscope.maths import expand_kv
from attnscope.records.check_report import FAIL, PASS, TOLERANCE
from attnscope.records.trace import EncoderDecoderTrace
from attnscope.tracing.seq2seq import trace_seq2seq_ids

KINDS = ("encoder", "decoder", "cross")


def trace_of(obj: Objective) -> EncoderDecoderTrace:
    """The verified trace of the objective's own source and decoder ids (no re-tokenization)."""
    n, m = obj.n_source, obj.model
    source, decoder = obj.tokens[:n], [replace(t, index=i) for i, t in enumerate(obj.tokens[n:])]
    target = str(m.tokenizer.decode(obj.target_ids))
    return trace_seq2seq_ids(m, obj.ids[:n], obj.ids[n:], source, decoder, obj.text, target)


def shared_trace(ctx: Context) -> EncoderDecoderTrace:
    """The trace, made once per attribution run."""
    if "seq2seq_trace" not in ctx.shared:
        ctx.shared["seq2seq_trace"] = trace_of(ctx.objective)
    tr: EncoderDecoderTrace = ctx.shared["seq2seq_trace"]
    return tr


def trace_check(tr: EncoderDecoderTrace) -> MethodCheck:
    """The three kinds' checks as one: the worst error, verified only when every kind passes."""
    reports = tr.check()
    statuses = {r.status for r in reports.values()}
    verified = None if statuses - {PASS, FAIL} else FAIL not in statuses
    worst = max(reports.values(), key=lambda r: r.max_error)
    names = ", ".join(f"{kind} {r.status}" for kind, r in reports.items())
    detail = (f"the trace's weights recomputed from each layer's q, k and weights ({names})" if verified is not None
              else "NOT VERIFIED: " + "; ".join(f"{k}: {r.unsupported}" for k, r in reports.items() if r.unsupported))
    return MethodCheck(name="attention recompute", value=worst.max_error, bound=worst.tolerance, verified=verified,
                       detail=detail)


def joined(cross: np.ndarray, self_rows: np.ndarray) -> np.ndarray:
    """[target, source] and [target, decoder token] -> [target, source + decoder token]: the two sides side by side."""
    return np.concatenate([cross, self_rows], axis=-1)


def _scores(ctx: Context, name: str, scores: np.ndarray, unit: str, settings: dict[str, object],
            check: MethodCheck | None = None, cost: Cost | None = None) -> MethodScores:
    tr = shared_trace(ctx)
    return MethodScores(method=name, scores=scores[: ctx.objective.n_targets], unit=unit,
                        check=check or trace_check(tr), cost=cost or Cost(forwards=1, backwards=0, seconds=0.0),
                        settings=settings)


def raw_attention(ctx: Context) -> MethodScores:
    tr = shared_trace(ctx)
    layer = layer_of(ctx, tr.decoder.n_layers)
    cross = heads_of(ctx, tr.cross.weights[layer].astype(np.float64))  # [target, source]
    self_rows = heads_of(ctx, tr.decoder.weights[layer].astype(np.float64))  # [target, decoder token]
    head = "mean" if ctx.settings.head is None else ctx.settings.head
    return _scores(ctx, "attention", joined(cross, self_rows),
                   "attention weight (source: cross-attention; target: decoder self-attention)",
                   {"layer": layer, "head": head})


def seq2seq_rollout(encoder: np.ndarray, decoder: np.ndarray, cross: np.ndarray, last: int) -> np.ndarray:
    """The rollout (module doc) after decoder layer `last`: encoder [layer, head, source, source], decoder [layer,
    head, target, target], cross [layer, head, target, source] -> [target, source + target], rows summing to 1."""
    n, m = encoder.shape[-1], decoder.shape[-1]
    r_enc = np.eye(n)
    for a in encoder.astype(np.float64).mean(axis=1):  # [source, source] per layer
        r_enc = (0.5 * a + 0.5 * np.eye(n)) @ r_enc
    memory = np.concatenate([r_enc, np.zeros((n, m))], axis=1)  # [source, source + target]: the encoder's output
    state = np.concatenate([np.zeros((m, n)), np.eye(m)], axis=1)  # [target, source + target]
    for layer in range(last + 1):
        a_self = decoder[layer].astype(np.float64).mean(axis=0)  # [target, target]
        state = (0.5 * a_self + 0.5 * np.eye(m)) @ state
        a_cross = cross[layer].astype(np.float64).mean(axis=0)  # [target, source]
        state = 0.5 * state + 0.5 * a_cross @ memory
    return state


def rollout(ctx: Context) -> MethodScores:
    tr = shared_trace(ctx)
    layer = layer_of(ctx, tr.decoder.n_layers)
    rolled = seq2seq_rollout(tr.encoder.weights, tr.decoder.weights, tr.cross.weights, layer)
    return _scores(ctx, "rollout", rolled, "share of the input (rollout through the encoder, then the decoder's "
                   "self- and cross-attention)", {"layer": layer})


def attention_gradients(obj: Objective, layer: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """"cross" and "decoder" -> (weights [head, target, key], dF/dweights [target row t, head, target, key]) of one
    decoder layer, from one forward and T backwards."""
    m = obj.model
    embeds = obj.embed(obj.ids[None].to(m.device)).detach().requires_grad_(True)
    keep = KeepContexts()
    with intervening(m.model, keep), capturing(m.model) as cap:
        f = obj.score_embeds(embeds)[0]  # [target]
    kind_of = {id(mod): kind for kind, mods in families.seq2seq_modules(m.model).items() for mod in mods}
    by_kind: dict[str, list[tuple[torch.Tensor, AttentionCall]]] = {kind: [] for kind in KINDS}
    for context, call in zip(keep.contexts, cap.calls, strict=True):
        by_kind[kind_of[id(call.module)]].append((context, call))
    picked = {kind: by_kind[kind][layer] for kind in ("cross", "decoder")}
    grads: dict[str, list[torch.Tensor]] = {kind: [] for kind in picked}
    for t in range(obj.n_targets):
        outs = torch.autograd.grad(f[t], [picked[k][0] for k in picked], retain_graph=t + 1 < obj.n_targets)
        for kind, g in zip(picked, outs, strict=True):
            c = picked[kind][1]
            v = expand_kv(c.v, c.weights.shape[1] // c.v.shape[1])[0].detach()  # [head, key, d_head]
            grads[kind].append(torch.einsum("qhd,hkd->hqk", g[0], v))  # [head, target, key]
    return {kind: (picked[kind][1].weights[0].detach(), torch.stack(grads[kind])) for kind in picked}


def attention_x_gradient(ctx: Context) -> MethodScores:
    obj, tr = ctx.objective, shared_trace(ctx)
    layer = layer_of(ctx, tr.decoder.n_layers)
    got = attention_gradients(obj, layer)
    sides = []
    for kind in ("cross", "decoder"):
        weights, grads = got[kind]
        product = (weights[None] * grads).double().cpu().numpy()  # [target, head, target, key]
        sides.append(np.stack([heads_of(ctx, product[t])[t] for t in range(obj.n_targets)]))  # [target, key]
    check = trace_check(tr)
    drift = max(float(np.abs(got[k][0].double().cpu().numpy() - getattr(tr, k).weights[layer]).max())
                for k in ("cross", "decoder"))
    if drift > TOLERANCE and check.verified is not False:
        check = MethodCheck(name="attention recompute", value=drift, bound=TOLERANCE, verified=False,
                            detail="the weights of the gradient's forward differ from the verified trace's")
    head = "mean" if ctx.settings.head is None else ctx.settings.head
    return _scores(ctx, "attention_x_gradient", joined(*sides), "attention weight x its gradient (source: "
                   "cross-attention; target: decoder self-attention)", {"layer": layer, "head": head}, check,
                   Cost(forwards=2, backwards=obj.n_targets, seconds=0.0))
