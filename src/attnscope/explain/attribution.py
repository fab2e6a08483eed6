"""The learner's walkthrough of one attribution method for one input token, with the model's own numbers.

`attribution_walkthrough(text, method, token)` runs the method through `attnscope.attribution` (the score every
other view shows) and then walks through how that score is made, step by step, recomputing what it can from
the same model: integrated gradients (the baseline, the path, gradients along it, the Riemann sum,
completeness), ALTI and value zeroing (one layer's decomposition, then the rollout: attnscope.explain.
attribution_mixing), and shorter walks for raw attention, rollout, saliency, input x gradient and leave-one-out.
Each walk ends on one number for token I, compared with attribute()'s score for it, and lists its checks.

Only the first target token is walked through (a causal LM's target of several tokens has one row per token;
`attnscope attribute` shows them all). The steps are Step records rendered by attnscope.explain.render.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rich.console import RenderableType
from rich.text import Text

from attnscope.attribution.api import attribute_objective, make_settings
from attnscope.attribution.methods import METHODS
from attnscope.attribution.objective import SEQ2SEQ, build_objective
from attnscope.errors import AttnscopeError, validate_index
from attnscope.explain import attribution_mixing as mixing
from attnscope.explain import attribution_steps as gradient
from attnscope.explain.attribution_common import SAME, Builder, Walk, check, method_check
from attnscope.explain.render import walkthrough_json, walkthrough_markdown, walkthrough_renderables
from attnscope.explain.steps import Step, Walkthrough
from attnscope.models import ModelLike, load_model
from attnscope.records.check_report import EXIT_CODES, FAIL, NOT_VERIFIED, PASS


@dataclass
class AttributionWalkthrough(Walkthrough):
    """A Walkthrough of one attribution method for one input token: its steps, the final number and its checks.

    layer: the layer whose decomposition is shown (ALTI, value zeroing, raw attention), -1 where none is; head is
    unused (0). checks: one dict per check {name, value, bound, ok (True/False/None), detail}."""

    method: str = ""
    description: str = ""  # what is explained: attribute()'s objective, one line
    target: str = ""  # the target token walked through (the first)
    final: float = float("nan")  # the walkthrough's number for token I
    reference: float = float("nan")  # attribute()'s score for token I
    unit: str = ""
    checks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def status(self) -> str:
        """FAIL if a check failed, else NOT VERIFIED if one could not be made, else PASS."""
        oks = [c["ok"] for c in self.checks]
        return FAIL if False in oks else NOT_VERIFIED if None in oks or not oks else PASS

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]


BUILDERS: dict[str, Builder] = {
    "integrated_gradients": gradient.integrated_gradients, "alti": mixing.alti, "value_zeroing": mixing.value_zeroing,
    "rollout": mixing.attention_rollout, "attention": mixing.raw_attention, "saliency": gradient.saliency,
    "input_x_gradient": gradient.input_x_gradient, "leave_one_out": gradient.leave_one_out,
    "leave_one_out_replaced": gradient.leave_one_out}
WALKED = tuple(BUILDERS)
ONE_STACK = ("attention", "rollout")  # walkthroughs of one stack's weights: not an encoder-decoder's three kinds


def require_walked(method: str) -> None:
    """A one-line error unless the method has a walkthrough (before any model is loaded)."""
    if method in WALKED:
        return
    what = f"{method!r} has no walkthrough" if method in METHODS else f"unknown method {method!r}"
    raise AttnscopeError(f"{what}: choose attribution={', '.join(WALKED[:-1])} or {WALKED[-1]}",
                         parameter="attribution")


def attribution_walkthrough(text: str, method: str, token: int, model: ModelLike = None, target: str | None = None,
                            layer: int | None = None, max_length: int | None = None, truncate: bool = True,
                            **settings: Any) -> AttributionWalkthrough:
    """The walkthrough of `method` for input token `token` (0-indexed) of text, on the model's own numbers.

    target: a causal LM's continuation (default its greedy next token); layer: the layer shown (ALTI, value
    zeroing, raw attention; default the last); settings: attribution Settings fields (ig_steps=...)."""
    require_walked(method)
    m = load_model(model)
    opts = make_settings(**settings, **({} if layer is None else {"layer": layer}))
    obj = build_objective(m, text, target, max_length=max_length, truncate=truncate)
    reason = METHODS[method].supports(obj)
    if reason is not None:
        raise AttnscopeError(reason, parameter="attribution")
    if obj.kind == SEQ2SEQ and method in ONE_STACK:
        raise AttnscopeError(f"the {method} walkthrough follows one stack's attention, and an encoder-decoder's "
                             f"{method} joins the encoder, the decoder and cross-attention (attribute() gives its "
                             "scores): walk through a gradient or leave-one-out method instead",
                             parameter="attribution")
    validate_index("token", token, obj.n_tokens, f"the input ({' '.join(t.text for t in obj.tokens)})")
    if layer is not None:
        validate_index("layer", layer, int(m.n_layers), m.name)
    scores = attribute_objective(obj, [method], opts).methods[method]
    if token in scores.unscored:  # e.g. leave-one-out never takes away a decoder's start token
        raise AttnscopeError(f"token {token} ({obj.tokens[token].text}) has no {method} score: "
                             f"{scores.unscored[token]}; choose another token", parameter="token")
    walk = Walk(obj, token, layer, opts, scores)
    steps, final, checks, shown, bound = BUILDERS[method](walk)
    checks = [*checks, same_as_attribute(walk, final, bound), method_check(scores)]
    return AttributionWalkthrough(
        {"name": m.name, "architecture": m.architecture, "layers": int(m.n_layers), "heads": int(m.n_heads)},
        shown, 0, token, [t.to_dict() for t in obj.tokens], [objective_step(walk), *steps], {},
        method=method, description=obj.description, target=obj.targets[0], final=final, reference=walk.reference,
        unit=scores.unit, checks=checks)


def same_as_attribute(walk: Walk, final: float, bound: float = SAME) -> dict[str, Any]:
    """The walkthrough's number for token I against attribute()'s, relative to max(1, max |score|)."""
    scale = max(1.0, float(np.abs(walk.scores.scores[0]).max()))
    return check("equals attribute()", abs(final - walk.reference) / scale, bound,
                 f"this walkthrough's {final:.6g} against attribute()'s {walk.reference:.6g} for token {walk.label}, "
                 "relative to max(1, max |score|)")


def objective_step(walk: Walk) -> Step:
    """What is explained, the tokens, and the model's own value of it."""
    obj = walk.obj
    ids = np.asarray([[t.id, int(t.special)] for t in obj.tokens])
    row = "" if walk.row is None else f"; the target is predicted at position {walk.row}"
    first = (f" This walkthrough follows the first target token, {obj.targets[0]!r} (attnscope attribute shows "
             "every target token's row)." if obj.n_targets > 1 else "")
    text = (f"What is explained: {obj.description}.{first} Its value from the model's own forward pass: "
            f"f(x) = {float(obj.reference[0]):.6g}. The input has {obj.n_tokens} tokens (0-indexed){row}; "
            f"token I = {walk.label}.")
    return Step("objective", "What is explained, and the tokens", text, f"[token] = [{obj.n_tokens}]",
                {"id, special": ids}, row_labels=walk.labels, col_labels=["id", "special"])


def header(w: AttributionWalkthrough) -> str:
    """One line: the model, the method, token I and what is explained."""
    token = w.tokens[w.token or 0]
    layer = "" if w.layer < 0 else f", layer {w.layer} shown"
    return (f"{w.model['name']}: {w.method} for input token {w.token} ({token['text']}){layer} (0-indexed; "
            f"{w.model['layers']} layers x {w.model['heads']} heads); explained: {w.description}")


def result_lines(w: AttributionWalkthrough) -> list[str]:
    """The final number beside attribute()'s, then each check with its verdict, then the overall status."""
    lines = [f"score of token {w.token} ({w.tokens[w.token or 0]['text']}) for {w.target!r}: {w.final:.6g} "
             f"({w.unit}); attribute() gives {w.reference:.6g}"]
    for c in w.checks:
        verdict = {True: "PASS", False: "FAIL", None: "NOT VERIFIED"}[c["ok"]]
        lines.append(f"check {c['name']}: {verdict}: {c['value']:.1e} (bound {c['bound']:.0e}); {c['detail']}")
    lines.append(f"{w.status}: {len(w.checks)} checks")
    return lines


def renderables(w: AttributionWalkthrough, width: int = 120, full: bool = False) -> list[RenderableType]:
    """The walkthrough for a terminal: render.py's steps under this walkthrough's header and result lines."""
    out = walkthrough_renderables(w, width, full)  # w.check is empty: render.py adds no head verdict
    good = w.status == PASS
    return [Text(header(w), style="bold"), *out[1:],
            Text("\n" + "\n".join(result_lines(w)), style="bold green" if good else "bold red")]


def markdown(w: AttributionWalkthrough, full: bool = False) -> str:
    body = walkthrough_markdown(w, full).split("\n", 1)[1]  # render.py's own heading replaced by this one
    return f"# {header(w)}\n{body}" + "\n".join(f"**{line}**\n" for line in result_lines(w))


def json_data(w: AttributionWalkthrough) -> dict[str, Any]:
    """render.py's JSON (every step's full arrays) with the method, the final number and the checks."""
    data = walkthrough_json(w)
    data.pop("head")
    data.pop("check")
    return {**data, "layer": None if w.layer < 0 else w.layer, "method": w.method, "description": w.description,
            "target": w.target, "score": w.final, "attribute_score": w.reference, "unit": w.unit,
            "checks": w.checks, "status": w.status}


__all__ = ["WALKED", "AttributionWalkthrough", "attribution_walkthrough", "json_data", "markdown", "renderables",
           "require_walked"]
