"""attribute(): which input tokens carry a prediction, by every method asked for, each beside its check."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Any

from attnscope.attribution.methods import Context, Settings, method_names, resolve
from attnscope.attribution.objective import Objective, build_objective
from attnscope.attribution.record import Attribution
from attnscope.errors import AttnscopeError
from attnscope.models import DeviceLike, DtypeLike, ModelLike, load_model

log = logging.getLogger(__name__)


def attribute(text: str, model: ModelLike = None, target: str | None = None,
              methods: str | Sequence[str] | None = None, *, max_length: int | None = None, truncate: bool = True,
              device: DeviceLike = None, dtype: DtypeLike = None, **settings: Any) -> Attribution:
    """Scores of each input token for one prediction, per method (float64 [target, token] each).

    What is explained depends on the model (attribution.objective): a causal LM's log-probability of each
    target token (default: its greedy next token), an encoder-decoder's of each target token given the source,
    an encoder's pooled-embedding cosine similarity with the unperturbed one. methods: "all" (every method that
    applies), None (the defaults: methods.DEFAULT_METHODS, those that apply), or names ("saliency,rollout");
    a method named that does not apply is an error. settings: fields of methods.Settings (ig_max_steps=1024,
    layer=3, max_flow_tokens=128, ...). Loading the model once (load_model) and calling this many times is cheap.
    """
    m = load_model(model, device=device, dtype=dtype)
    names = method_names(methods)  # before any forward: a typo is instant
    opts = make_settings(**settings)
    obj = build_objective(m, text, target, max_length=max_length, truncate=truncate)
    return attribute_objective(obj, names, opts, explicit=methods is not None and methods != "all")


def make_settings(**settings: Any) -> Settings:
    """Settings from keywords, each name checked (a typo is a one-line error) and each count positive."""
    known = {f.name for f in fields(Settings)}
    for name, value in settings.items():
        if name not in known:
            raise AttnscopeError(f"unknown attribution setting {name!r}: use one of {', '.join(sorted(known))}",
                                 parameter=name)
        if name not in ("layer", "head", "ig_tolerance") and (not isinstance(value, int) or value < 1):
            raise AttnscopeError(f"{name}={value!r} must be a positive integer", parameter=name)
    tol = settings.get("ig_tolerance", Settings.ig_tolerance)
    if not isinstance(tol, int | float) or not 0 < tol < 1:
        raise AttnscopeError(f"ig_tolerance={tol!r} must be a fraction between 0 and 1 (0.01 is 1%)",
                             parameter="ig_tolerance")
    steps = settings.get("ig_steps", Settings.ig_steps)
    if steps < 2:
        raise AttnscopeError(f"ig_steps={steps}: the trapezoid rule needs at least 2 points on the path; give 2 or "
                             "more", parameter="ig_steps")
    cap = settings.get("ig_max_steps", Settings.ig_max_steps)
    if steps > cap:
        raise AttnscopeError(f"ig_steps={steps} is more than the step cap, {cap}: give ig_steps at most {cap}, or "
                             "raise the cap", parameter="ig_steps")
    return replace(Settings(), **settings)


def attribute_objective(obj: Objective, names: Sequence[str], settings: Settings,
                        explicit: bool = True) -> Attribution:
    """Run the named methods on one objective (build_objective); the objective can be reused across calls."""
    ctx = Context(obj, settings)
    scores = {}
    chosen, skipped = resolve(names, obj, explicit)
    for method in chosen:
        log.debug("attribution: running %s", method.name)
        scores[method.name] = method.run(ctx)
    m = obj.model
    return Attribution(model=m.name, architecture=m.architecture, kind=obj.kind, description=obj.description,
                       tokens=list(obj.tokens), targets=list(obj.targets), methods=scores, skipped=skipped)
