"""Gradient methods through Captum: saliency, input x gradient, integrated gradients; all on the input embeddings.

- saliency (Simonyan, Vedaldi & Zisserman 2014; for text Li et al. 2016): the L2 norm over d_model of the
  gradient of the objective with respect to each token's embedding. Cost: T forwards and T backwards.
- input x gradient (Shrikumar et al. 2016): embedding . gradient per token (summed over d_model, signed): the
  first-order Taylor share of each token. Cost: T forwards and T backwards.
- integrated gradients (Sundararajan, Taly & Yan 2017): (x - x') . the mean gradient along the straight path
  from the baseline x' to x, summed over d_model; its token scores add up to f(x) - f(x') (completeness).
  Baseline: each token's embedding replaced by the baseline token's (objective.baseline_id: [MASK] where the
  tokenizer has one, else its pad, else its end-of-text token); special tokens keep their own, so they score 0.
  Steps: trapezoid-rule points (IG_RULE says why; Captum's weights rescaled to sum to 1), batched; doubled from
  --ig-steps until completeness is within --ig-tolerance or --ig-max-steps is reached (then the check fails and
  says so).
  Cost: T x the steps tried (F + B), plus 1 F.

Checks: saliency compares |g| with a central finite difference of the objective along the gradient's direction
(one batched forward of 2 rows per target), |fd - |g|| / |g| within FD_BOUND; input x gradient compares the sum of
its scores, x . g, with a central difference along x itself (FD_STEP says why its step is 1e-3), within FD_BOUND;
integrated gradients' completeness is computed against f(x) from the model's own forward.
Captum is used rather than hand-written gradients, as the issue asks; it adds no measurable time beyond the
forward and backward passes (benchmarks/bench_attribute.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from attnscope.attribution.methods import Context
from attnscope.attribution.objective import Objective, baseline_id
from attnscope.attribution.record import Cost, MethodCheck, MethodScores
from attnscope.errors import AttnscopeError

FD_BOUND = 0.02  # float32 central differences: rounding ~1e-7 |f| / h and curvature ~h^2 keep them within ~0.5%
# input x gradient: h, a fraction of x (the scores' sum is the derivative along x). The direction x moves every
# token at once, so the step is h |x| across the whole input: at h = 0.01 it crossed 11 of tiny-t5's 3,840 ReLU
# pre-activations (T5's FFN) on "The cat sat on the mat." -> "Die Katze sass.", and the difference across those
# kinks was 7.5% off the gradient (also in float64: truncation, not rounding); at 1e-3 none (0.04% in float32).
# Smaller is rounding's turn: float32 f (|f| ~ 10 nats) rounds by ~1e-6, which the difference divides by 2h, so
# ~1e-3 / sum |scores| at h = 1e-3 (measured on the tiny models and SmolLM2: at most 0.5%, under FD_BOUND).
FD_STEP = 1e-3
FD_STEP_GRADIENT = 2e-4  # saliency: h along the unit gradient, a fraction of |x| (curvature across tokens is larger)
# The trapezoid rule, not Captum's default Gauss-Legendre: SmolLM2's path from the baseline is rough (log p jumps by
# 6 nats between neighbouring alphas), and at 512 steps the trapezoid's completeness error was 0.44% where
# Gauss-Legendre's was 5.2% (and the midpoint rule's 12%), measured on "The capital of France is" -> " Paris".
IG_RULE = "riemann_trapezoid"
# Captum's trapezoid rule takes n points on linspace(0, 1, n), spaced 1/(n - 1), but weighs them 1/n (halved at
# the ends): its weights sum to (n - 1) / n, so every sum it returns is short by 1/n (a 0.78% completeness gap at
# 128 steps from the weights alone, measured on MiniLM). Rescaling by n / (n - 1) gives the trapezoid rule's own
# weights on the same points (MiniLM at 32 steps: 3.2% -> 0.056%).
COMPLETENESS_FLOOR = 1e-3  # |f(x) - f(x')| below this is treated as this, so completeness stays finite


def _captum() -> object:
    try:
        import captum.attr
    except ImportError as exc:
        raise AttnscopeError("the gradient methods need Captum: pip install 'attnscope[attribute]' "
                             "(or captum)") from exc
    return captum.attr


def ig_weights(steps: int) -> tuple[np.ndarray, list[float]]:
    """The weights [steps] (float64, summing to 1) and alphas [steps] integrated_gradients sums with at this many
    steps: Captum's IG_RULE alphas, and its step sizes times trapezoid_fix(steps). The walkthrough reads them here."""
    _captum()
    from captum.attr._utils.approximation_methods import approximation_parameters

    sizes, alphas = approximation_parameters(IG_RULE)
    return np.asarray(sizes(steps), dtype=np.float64) * trapezoid_fix(steps), list(alphas(steps))


def trapezoid_fix(steps: int) -> float:
    """n / (n - 1): what Captum's trapezoid sums are multiplied by to become the trapezoid rule's (IG_RULE)."""
    return steps / (steps - 1)


def _forward(obj: Objective) -> Callable[[torch.Tensor], torch.Tensor]:
    """Captum's forward function: embeds [batch, token, d_model] -> [batch, target]."""
    return lambda embeds: obj.score_embeds(embeds)


def _input_embeds(obj: Objective) -> torch.Tensor:
    with torch.no_grad():
        embeds = obj.embed(obj.ids[None].to(obj.model.device)).detach()  # [1, token, d_model]
    return embeds.requires_grad_(True)  # Captum would set it, with a warning


def gradients(obj: Objective) -> tuple[torch.Tensor, torch.Tensor]:
    """(embeds [1, token, d_model], gradients [target, token, d_model]) through Captum's Saliency (signed)."""
    attr = _captum()
    embeds = _input_embeds(obj)
    sal = attr.Saliency(_forward(obj))  # type: ignore[attr-defined]
    grads = [sal.attribute(embeds, target=t, abs=False)[0] for t in range(obj.n_targets)]
    return embeds, torch.stack(grads).detach()


def finite_difference_check(obj: Objective, embeds: torch.Tensor, grads: torch.Tensor) -> MethodCheck:
    """Central difference of each target's objective along its gradient's direction u: (f(x+hu) - f(x-hu)) / 2h
    should equal g . u = |g|. The measured value: the largest |fd - |g|| / |g| over targets."""
    errors = []
    h = FD_STEP_GRADIENT * float(embeds.detach().norm())
    for t in range(obj.n_targets):
        g = grads[t][None]  # [1, token, d_model]
        u = g / g.norm()
        with torch.no_grad():
            pair = obj.score_embeds(torch.cat([embeds + h * u, embeds - h * u]))[:, t].double()  # [2]
        fd = float(pair[0] - pair[1]) / (2 * h)
        errors.append(abs(fd - float(g.norm())) / max(float(g.norm()), 1e-12))
    worst = max(errors)
    ok = bool(worst <= FD_BOUND)  # NaN fails
    return MethodCheck(name="finite difference", value=worst, bound=FD_BOUND, verified=ok,
                       detail=f"the gradient against a central finite difference along it (h = "
                              f"{FD_STEP_GRADIENT:g} x |x|), relative to |gradient|, worst target")


def saliency(ctx: Context) -> MethodScores:
    obj = ctx.objective
    embeds, grads = gradients(obj)
    scores = grads.double().norm(dim=-1).cpu().numpy()  # [target, token]
    return MethodScores(method="saliency", scores=scores, unit="|gradient| (L2 over d_model)",
                        check=finite_difference_check(obj, embeds, grads),
                        cost=Cost(forwards=2 * obj.n_targets, backwards=obj.n_targets, seconds=0.0))


def input_x_gradient(ctx: Context) -> MethodScores:
    obj = ctx.objective
    attr = _captum()
    embeds = _input_embeds(obj)
    ixg = attr.InputXGradient(_forward(obj))  # type: ignore[attr-defined]
    rows = [ixg.attribute(embeds, target=t)[0].detach() for t in range(obj.n_targets)]  # [token, d_model] each
    scores = torch.stack(rows).double().sum(dim=-1)  # [target, token]
    return MethodScores(method="input_x_gradient", scores=scores.cpu().numpy(),
                        unit=f"embedding . gradient ({_unit(obj)})", check=scaling_check(obj, embeds, scores),
                        cost=Cost(forwards=2 * obj.n_targets, backwards=obj.n_targets, seconds=0.0))


def scaling_check(obj: Objective, embeds: torch.Tensor, scores: torch.Tensor) -> MethodCheck:
    """The scores of a target add up to x . g, the derivative of f along x itself: compare their sum with the
    central difference (f((1+h) x) - f((1-h) x)) / 2h (one batched forward of 2 rows), relative to sum |score|."""
    with torch.no_grad():
        pair = obj.score_embeds(torch.cat([embeds * (1 + FD_STEP), embeds * (1 - FD_STEP)])).double()  # [2, target]
    fd = (pair[0] - pair[1]) / (2 * FD_STEP)  # [target]
    scores = scores.detach()
    errors = (fd - scores.sum(dim=-1)).abs() / scores.abs().sum(dim=-1).clamp(min=1e-12)
    worst = float(errors.max())
    return MethodCheck(name="finite difference", value=worst, bound=FD_BOUND, verified=bool(worst <= FD_BOUND),
                       detail=f"the scores' sum against a central finite difference along x (h = {FD_STEP:g}), "
                              "relative to the sum of |scores|, worst target")


def _unit(obj: Objective) -> str:
    return "cosine similarity" if obj.kind == "encoder" else "nats of log-probability"


def baseline_embeds(obj: Objective) -> torch.Tensor:
    """[1, token, d_model]: the baseline token's embedding at every position but the special tokens'."""
    ids = torch.where(obj.special, obj.ids, torch.full_like(obj.ids, baseline_id(obj.model)))
    with torch.no_grad():
        return obj.embed(ids[None].to(obj.model.device)).detach()


def integrated_gradients(ctx: Context) -> MethodScores:
    obj, s = ctx.objective, ctx.settings
    attr = _captum()
    embeds, base = _input_embeds(obj), baseline_embeds(obj)
    with torch.no_grad():
        f_base = obj.score_embeds(base)[0].double()  # [target]
    delta = obj.reference.double() - f_base  # [target]: f(x) from the model's own forward
    ig = attr.IntegratedGradients(_forward(obj))  # type: ignore[attr-defined]
    rows, errors, steps_used, tried = [], [], [], 0
    for t in range(obj.n_targets):
        steps = s.ig_steps
        while True:
            a = ig.attribute(embeds, baselines=base, target=t, n_steps=steps, method=IG_RULE,
                             internal_batch_size=max(1, s.grad_tokens // obj.n_tokens))
            tried += steps
            row = a[0].detach().double().sum(dim=-1) * trapezoid_fix(steps)  # [token]
            err = completeness(row, float(delta[t]))
            if err <= s.ig_tolerance or steps * 2 > s.ig_max_steps:
                break
            steps *= 2
        rows.append(row)
        errors.append(err)
        steps_used.append(steps)
    worst = max(errors)
    ok = bool(worst <= s.ig_tolerance)
    capped = "" if ok else f"; the cap of {s.ig_max_steps} steps was reached (raise ig_max_steps)"
    check = MethodCheck(name="completeness", value=worst, bound=s.ig_tolerance, verified=ok,
                        detail=f"|sum of scores - (f(x) - f(baseline))| / |f(x) - f(baseline)| at "
                               f"{', '.join(map(str, steps_used))} steps{capped}")
    return MethodScores(method="integrated_gradients", scores=torch.stack(rows).cpu().numpy(),
                        unit=f"(x - baseline) . mean gradient ({_unit(obj)})", check=check,
                        cost=Cost(forwards=tried + 1, backwards=tried, seconds=0.0),
                        settings={"steps": steps_used, "method": IG_RULE,
                                  "baseline": _baseline_name(obj), "f_x": obj.reference.double().tolist(),
                                  "f_baseline": f_base.tolist()})


def completeness(row: torch.Tensor, delta: float) -> float:
    """|sum(row) - delta| / max(|delta|, COMPLETENESS_FLOOR); NaN stays NaN."""
    return abs(float(row.sum()) - delta) / max(abs(delta), COMPLETENESS_FLOOR)


def _baseline_name(obj: Objective) -> str:
    token = obj.model.tokenizer.convert_ids_to_tokens(baseline_id(obj.model))
    return f"{token} at every non-special token"


def as_array(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().cpu().numpy()
