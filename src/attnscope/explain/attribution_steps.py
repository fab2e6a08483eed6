"""The gradient and perturbation walkthroughs: integrated gradients step by step, and shorter walks for saliency,
input x gradient and leave-one-out (attnscope.explain.attribution calls these; each returns a `Built`).

Integrated gradients (Sundararajan, Taly & Yan 2017) is recomputed here from the model's own gradients along the
same straight path and with the same Riemann rule (Captum's step sizes and alphas, attribution.gradients.IG_RULE)
as Captum's run inside attribute(); the two sums are compared, and completeness is recomputed from them.
"""

from __future__ import annotations

import numpy as np
import torch

from attnscope.attribution.gradients import IG_RULE, baseline_embeds, completeness, gradients, ig_weights
from attnscope.attribution.leave_one_out import scores_of
from attnscope.attribution.objective import ENCODER, Objective, baseline_id
from attnscope.explain.attribution_common import ALPHAS, Built, Walk, check, dim_labels, head_dims
from attnscope.explain.steps import Step

IG_SAME = 1e-5  # |our float64 sum - Captum's float32 one| relative to max(1, max |score|): float32 rounding
GRAD_SAME = 1e-6  # saliency and input x gradient: the same gradient (Captum's Saliency), summed in float64
LOO_SAME = 1e-5  # leave-one-out: 2 rows here, n + 1 rows in attribute()'s batch: float32 rounds them differently


def input_embeds(obj: Objective) -> torch.Tensor:
    """[1, token, d_model]: the embeddings the model's forward starts from."""
    with torch.no_grad():
        return obj.embed(obj.ids[None].to(obj.model.device)).detach()


def path_gradients(obj: Objective, x: torch.Tensor, base: torch.Tensor, alphas: list[float],
                   rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """f and its gradient at each point x' + alpha (x - x'), batched: ([alpha], [alpha, token, d_model])."""
    a = torch.tensor(alphas, dtype=x.dtype, device=x.device)
    fs, gs = [], []
    for s in range(0, len(alphas), rows):
        points = (base + a[s:s + rows, None, None] * (x - base)).requires_grad_(True)  # [rows, token, d_model]
        f = obj.score_embeds(points)[:, 0]  # [rows]: the first target
        (g,) = torch.autograd.grad(f.sum(), points)  # rows are independent: each row's gradient is its own
        fs.append(f.detach())
        gs.append(g.detach())
    return torch.cat(fs), torch.cat(gs)


def rule(steps: int) -> tuple[np.ndarray, list[float]]:
    """The weights and alphas attribute() integrates with at this many steps (attribution.gradients.ig_weights)."""
    return ig_weights(steps)


def integrated_gradients(walk: Walk) -> Built:
    obj, i, ms = walk.obj, walk.token, walk.scores
    steps = int(ms.settings["steps"][0])
    weights, alphas = rule(steps)
    x, base = input_embeds(obj), baseline_embeds(obj)
    f_path, grads = path_gradients(obj, x, base, alphas, max(1, walk.settings.grad_tokens // obj.n_tokens))
    diff = (x - base)[0].double()  # [token, d_model]
    dots = torch.einsum("ktd,td->kt", grads.double(), diff).cpu().numpy()  # [alpha, token]: (x - x') . g
    ours = (weights[:, None] * dots).sum(axis=0)  # [token]: the Riemann sum per token
    shown = sorted({round(a * (steps - 1)) for a in ALPHAS})  # the path points nearest ALPHAS
    f_x, f_base = float(ms.settings["f_x"][0]), float(ms.settings["f_baseline"][0])
    out = [_baseline_step(walk, x, base, f_x, f_base),
           _path_step(walk, x, base, alphas, shown, f_path),
           _gradient_step(walk, grads, dots, alphas, shown),
           _sum_step(walk, weights, alphas, dots, ours, steps),
           _completeness_step(walk, ours, f_x, f_base)]
    gap = completeness(torch.from_numpy(ours), f_x - f_base)
    scale = max(1.0, float(np.abs(ms.scores[0]).max()))
    checks = [check("Riemann sum = Captum's", float(np.abs(ours - ms.scores[0]).max()) / scale, IG_SAME,
                    "every token's sum here against Captum's attribution in attribute(), relative to "
                    "max(1, max |score|)"),
              check("completeness", gap, walk.settings.ig_tolerance,
                    f"|sum over tokens - (f(x) - f(x'))| / |f(x) - f(x')| = {gap:.2%} (the method asks for "
                    f"<= {walk.settings.ig_tolerance:.0%}; attribute() measured {ms.check.value:.2%})")]
    return out, float(ours[i]), checks, -1, IG_SAME


def _baseline_step(walk: Walk, x: torch.Tensor, base: torch.Tensor, f_x: float, f_base: float) -> Step:
    i, obj = walk.token, walk.obj
    name = str(walk.scores.settings["baseline"])
    token = obj.model.tokenizer.convert_ids_to_tokens(baseline_id(obj.model))
    special = " Token I is a special token: it keeps its own embedding, so x_I = x'_I and its score is 0." \
        if obj.tokens[i].special else ""
    text = (f"Integrated gradients needs a baseline x', an input that carries no information, and explains the "
            f"difference f(x) - f(x'). Here: {name} (special tokens keep their own, so the difference is "
            f"in the words). Why {token}: it is what a model reads where a word is missing ([MASK] in BERT's "
            f"pre-training; a decoder without one has its pad or end-of-text token), so x' is an input the model "
            f"knows with the words taken out, where an all-zero embedding would be a vector it never saw."
            f"{special} f(x) = {f_x:.6g}, f(x') = {f_base:.6g}, f(x) - f(x') = {f_x - f_base:.6g}.")
    vecs = torch.stack([x[0, i], base[0, i], x[0, i] - base[0, i]])  # [3, d_model]
    norms = vecs.double().norm(dim=-1, keepdim=True).cpu().numpy()
    arr = np.concatenate([norms, head_dims(vecs)], axis=1)
    return Step("baseline", "The baseline x' and what is explained", text, f"[d_model] = [{x.shape[-1]}]",
                {f"token {walk.label}": arr},
                array_labels={f"token {walk.label}": (["x_I", "x'_I", "x_I - x'_I"], ["|v|", *dim_labels()])})


def _path_step(walk: Walk, x: torch.Tensor, base: torch.Tensor, alphas: list[float], shown: list[int],
               f_path: torch.Tensor) -> Step:
    i = walk.token
    pts = torch.stack([base[0, i] + alphas[k] * (x[0, i] - base[0, i]) for k in shown])  # [shown, d_model]
    arr = np.concatenate([np.asarray([[alphas[k], float(f_path[k])] for k in shown]), head_dims(pts)], axis=1)
    text = ("The straight path from the baseline to the input, every token at once: x' + alpha (x - x') for alpha "
            f"from 0 to 1 at {len(alphas)} points (Captum's {IG_RULE} alphas; shown: the points nearest "
            f"{', '.join(map(str, ALPHAS))}). f is the objective at each point (one batched forward); token I's "
            "point is shown.")
    return Step("path", "The path x' + alpha (x - x')", text, f"[alpha, d_model] = [{len(alphas)}, {x.shape[-1]}]",
                {"path": arr}, array_labels={"path": ([f"k={k}" for k in shown], ["alpha", "f", *dim_labels()])})


def _gradient_step(walk: Walk, grads: torch.Tensor, dots: np.ndarray, alphas: list[float], shown: list[int]) -> Step:
    i = walk.token
    g = grads[shown, i].double()  # [shown, d_model]
    arr = np.concatenate([np.asarray([[alphas[k], float(g[n].norm()), dots[k, i]] for n, k in enumerate(shown)]),
                          head_dims(g)], axis=1)
    text = ("The gradient of f with respect to token I's embedding at each point (one backward per batch of "
            "points): its norm, its first dimensions, and (x_I - x'_I) . g_I, how fast f moves along token I's "
            "part of the path.")
    return Step("gradients", "Gradients along the path", text, f"[alpha, d_model] = [{len(alphas)}, {g.shape[-1]}]",
                {"gradient": arr},
                array_labels={"gradient": ([f"k={k}" for k in shown],
                                           ["alpha", "|g_I|", "(x_I-x'_I).g_I", *dim_labels()])})


def _sum_step(walk: Walk, weights: np.ndarray, alphas: list[float], dots: np.ndarray, ours: np.ndarray,
              steps: int) -> Step:
    i, captum = walk.token, float(walk.scores.scores[0, walk.token])
    arr = np.stack([np.asarray(alphas), weights, dots[:, i], weights * dots[:, i]], axis=1)  # [alpha, 4]
    text = (f"Token I's score: (x_I - x'_I) . (the weighted sum of the gradients over the path) = sum_k w_k "
            f"(x_I - x'_I) . g_I(alpha_k), at the {steps} points attribute() settled on ({_how(walk, steps)}). "
            f"Captum's {IG_RULE} step sizes are 1/{steps}, halved "
            f"at both ends, and sum to 1 - 1/{steps}; attribute() rescales them by {steps}/{steps - 1} to the "
            f"trapezoid rule's own weights on these points, w_k = 1/{steps - 1} halved at both ends, which sum to "
            f"{weights.sum():.6g}. Sum here: {ours[i]:.6g}; attribute()'s (Captum's, rescaled): {captum:.6g}.")
    return Step("riemann", "The Riemann sum: token I's score", text, f"[alpha] = [{steps}]", {"terms": arr},
                array_labels={"terms": ([f"k={k}" for k in range(steps)],
                                        ["alpha", "w_k", "(x_I-x'_I).g_I", "w_k x that"])})


def _how(walk: Walk, steps: int) -> str:
    """How attribute() came to this many steps."""
    s = walk.settings
    if steps == s.ig_steps and walk.scores.check.verified:
        return f"the first number tried, {steps}, met completeness"
    cap = " or the cap was reached" if steps * 2 > s.ig_max_steps else ""
    return f"doubled from {s.ig_steps} until completeness held{cap}"


def _completeness_step(walk: Walk, ours: np.ndarray, f_x: float, f_base: float) -> Step:
    total, delta = float(ours.sum()), f_x - f_base
    gap = completeness(torch.from_numpy(ours), delta)
    per_token = np.stack([ours, walk.scores.scores[0]], axis=1)  # [token, 2]
    summary = np.asarray([[total, f_x, f_base, delta, total - delta, gap]])
    ok = "within" if gap <= walk.settings.ig_tolerance else "NOT within"
    steps = int(walk.scores.settings["steps"][0])
    raw = total * (steps - 1) / steps  # Captum's weights as they come, summing to 1 - 1/n
    text = (f"Completeness: the scores of all tokens add up to f(x) - f(x') when the integral is exact. "
            f"Sum {total:.6g} against {delta:.6g}: gap {total - delta:.3g}, {gap:.2%} of |f(x) - f(x')|, {ok} the "
            f"{walk.settings.ig_tolerance:.0%} the method requires. With Captum's step sizes as they come (summing "
            f"to 1 - 1/{steps}) the sum would be {raw:.6g}, a gap of {abs(raw - delta) / max(abs(delta), 1e-3):.2%}.")
    return Step("completeness", "Completeness: the sum over tokens", text, f"[token] = [{walk.obj.n_tokens}]",
                {"scores": per_token, "sum": summary}, row_labels=walk.labels,
                array_labels={"scores": (walk.labels, ["here", "Captum"]),
                              "sum": (["all tokens"], ["sum", "f(x)", "f(x')", "f(x)-f(x')", "gap", "gap/|f-f'|"])})


def _gradient_walk(walk: Walk, times_input: bool) -> Built:
    obj, i = walk.obj, walk.token
    embeds, grads = gradients(obj)  # Captum's Saliency, signed: [1, token, d_model], [target, token, d_model]
    g, x = grads[0].detach().double(), embeds[0].detach().double()  # [token, d_model]
    norms, dots = g.norm(dim=-1).cpu().numpy(), (x * g).sum(dim=-1).cpu().numpy()  # [token]
    arr = np.concatenate([np.stack([norms, dots], axis=1), head_dims(g)], axis=1)
    what = "x_i . g_i, the first-order Taylor share of each token" if times_input else "|g_i|, the L2 norm"
    text = (f"The gradient of f with respect to each token's input embedding (one backward, Captum's Saliency), "
            f"and the score: {what}. Token I = {walk.label}: |g_I| = {norms[i]:.6g}, x_I . g_I = {dots[i]:.6g}.")
    step = Step("gradient", "The gradient at the input", text, f"[token, d_model] = [{obj.n_tokens}, {g.shape[-1]}]",
                {"gradient": arr}, row_labels=walk.labels,
                array_labels={"gradient": (walk.labels, ["|g_i|", "x_i.g_i", *dim_labels()])})
    return [step], float(dots[i] if times_input else norms[i]), [], -1, GRAD_SAME


def saliency(walk: Walk) -> Built:
    return _gradient_walk(walk, times_input=False)


def input_x_gradient(walk: Walk) -> Built:
    return _gradient_walk(walk, times_input=True)


def leave_one_out(walk: Walk) -> Built:
    obj, i = walk.obj, walk.token
    replaced = walk.scores.method == "leave_one_out_replaced"
    rows = (scores_of(obj, replaced=[[], [i]]) if replaced else scores_of(obj, removed=[[], [i]]))  # [2, target]
    f_x, f_without = float(rows[0, 0]), float(rows[1, 0])
    how = (f"replaced by the baseline token {walk.scores.settings.get('baseline')}" if replaced else
           "removed (the tokens after it close up: one position fewer)")
    kept = [t.text for n, t in enumerate(obj.tokens) if n != i] if not replaced else None
    after = f" The input without it: {' '.join(kept)}." if kept is not None else ""
    unit = "cosine similarity" if obj.kind == ENCODER else "log-probability"
    text = (f"Token I = {walk.label} {how}; both inputs run in one batched forward. The score is how much f falls: "
            f"f(x) - f(x without I) = {f_x:.6g} - {f_without:.6g} = {f_x - f_without:.6g} ({unit}).{after}")
    step = Step("perturbed", "The input without token I", text, "[variant] = [2]",
                {"f": np.asarray([[f_x, f_without, f_x - f_without]])},
                array_labels={"f": (["first target"], ["f(x)", "f(x without I)", "score"])})
    return [step], f_x - f_without, [], -1, LOO_SAME
