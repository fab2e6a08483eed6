"""`POST /api/attribute`: which input tokens carry a prediction, per method, each beside its check (issue 31).

Bounded like the interventions: the text's characters (fields) and tokens (max_length, at most the server's
max_tokens; a longer text is refused, not cut), the pool's queue and deadline, one model forward at a time; and by
its cost: one forward of the input is timed and the methods' forward-pass equivalents (`rows`) are admitted against
the request's deadline before any method runs (422 naming the costliest methods otherwise), and every layer of
every forward checks the job's stop event. The answer is `Attribution.to_json()` plus "view": the payload that
assets/attribution.js draws (`attnscope.renderAttributionResponse(element, answer)`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from starlette.routing import Route

from attnscope.serve.ablation import admit_by_deadline, stopping, timed
from attnscope.serve.endpoints import Run, json_answer, pool_route
from attnscope.serve.fields import Field, max_length_field, model_field, validate_tokens
from attnscope.serve.pool import checkpoint
from attnscope.serve.service import Service
from attnscope.serve.settings import Settings
from attnscope.views.attribution import attribution_payload

if TYPE_CHECKING:
    from attnscope.attribution.methods import Method
    from attnscope.attribution.objective import Objective
    from attnscope.attribution.record import Attribution

TRACED = ("attention", "rollout", "flow", "attention_x_gradient")  # methods sharing one traced, recomputed forward
BACKWARD = 2.0  # a backward pass costs about two forwards
MAX_IG_STEPS = 1024  # the most integrated-gradient steps a request may ask for
SETTINGS = ("layer", "head", "ig_steps", "ig_max_steps", "ig_tolerance")  # body fields that are methods.Settings


@dataclass(frozen=True)
class AttributeRequest:
    text: str
    model: str | None
    target: str | None
    methods: str | None
    layer: int | None = None
    head: int | None = None
    ig_steps: int | None = None
    ig_max_steps: int | None = None
    ig_tolerance: float | None = None
    raw_tokens: bool = False
    max_length: int | None = None  # null: the server's max_tokens or the model's positions, the smaller
    deadline: float = math.inf  # time.monotonic() by which the answer is due (the pool's deadline)


NULLABLE_NUMBER = {"type": "number", "nullable": True}  # an answer's number; null: NaN
_ROWS = {"type": "array", "items": {"type": "array", "items": NULLABLE_NUMBER},
         "description": "[target][token]; null: NaN"}
_CHECK = {"type": "object", "required": ["name", "status", "value", "bound", "verified", "detail"], "properties": {
    "name": {"type": "string"}, "status": {"type": "string", "enum": ["PASS", "FAIL", "NOT VERIFIED"]},
    "value": NULLABLE_NUMBER, "bound": NULLABLE_NUMBER, "verified": {"type": "boolean", "nullable": True},
    "detail": {"type": "string"}}}
_METHOD = {"type": "object", "required": ["method", "unit", "scores", "check", "cost", "settings"], "properties": {
    "method": {"type": "string"}, "unit": {"type": "string"}, "scores": _ROWS, "check": _CHECK,
    "cost": {"type": "object", "description": "forwards, backwards (one sequence each) and seconds"},
    "settings": {"type": "object"}}}


def objective_properties(what: str) -> dict[str, Any]:
    """The 200 answer's properties that say what is explained (the objective: model, kind, description, targets),
    shared by /api/attribute and /api/faithfulness; what: the kind's description."""
    return {"model": {"type": "string"},
            "kind": {"type": "string", "enum": ["causal", "seq2seq", "encoder"], "description": what},
            "description": {"type": "string"}, "targets": {"type": "array", "items": {"type": "string"}}}


# The 200 answer's schema, for the OpenAPI document (serve/openapi.py).
RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["model", "architecture", "kind", "description", "tokens", "targets", "status", "methods", "view"],
    "properties": {
        **objective_properties("what is explained"), "architecture": {"type": "string"},
        "tokens": {"type": "array", "items": {"type": "object"}},
        "status": {"type": "string", "enum": ["PASS", "FAIL", "NOT VERIFIED"]},
        "methods": {"type": "object", "additionalProperties": _METHOD, "description": "by method name"},
        "skipped": {"type": "object", "additionalProperties": {"type": "string"},
                    "description": "methods left out (not named, not applying to the model) -> why"},
        "rank_agreement": {"type": "array",
                           "items": {"type": "array", "items": {"type": "array", "items": NULLABLE_NUMBER}},
                           "description": "per target, Spearman's rho [method, method] (null: not defined)"},
        "view": {"type": "object", "description": "the attribution view's payload (views/attribution.py), drawn "
                 "by attnscope.renderAttributionResponse"},
    },
}
SUMMARY = ("Which input tokens carry a prediction, per attribution method, each beside its check "
           "(as `attnscope attribute --format json`, plus the view's payload)")


def attribute_fields(settings: Settings, models: Sequence[str]) -> list[Field]:
    """The body of POST /api/attribute (validation and the OpenAPI schema alike)."""
    return [
        Field("text", "string", "The input (encoder-decoders: the source).", required=True,
              max_length=settings.max_chars),
        model_field(models),
        Field("target", "string", "Causal LMs and encoder-decoders: the continuation explained, e.g. \" Paris\" "
              "(null: the model's greedy next token; encoders explain their pooled embedding and take none).",
              nullable=True, max_length=settings.max_chars),
        methods_field("A method named that does not apply is refused (422)."),
        Field("layer", "integer", "attention, attention_x_gradient, rollout: the layer, 0-indexed (null: the last).",
              nullable=True, minimum=0),
        Field("head", "integer", "attention, attention_x_gradient: one head, 0-indexed (null: the mean of the "
              "heads).", nullable=True, minimum=0),
        Field("ig_steps", "integer", "integrated_gradients: the first number of steps (null: 32), doubled until "
              "completeness holds.", nullable=True, minimum=1, maximum=MAX_IG_STEPS),
        Field("ig_max_steps", "integer", "integrated_gradients: the cap on steps (null: 512).", nullable=True,
              minimum=1, maximum=MAX_IG_STEPS),
        Field("ig_tolerance", "number", "integrated_gradients: the completeness wanted, a fraction of "
              "f(x) - f(baseline) (null: 0.01).", nullable=True, minimum=0, maximum=0.5, exclusive_minimum=True),
        Field("raw_tokens", "boolean", "The view's tokens as the tokenizer spells its pieces (\"Ġworld\") rather "
              "than as they read.", default=False),
        max_length_field(settings),
    ]


def methods_field(note: str) -> Field:
    """The methods field of an endpoint that runs attribution methods; note: what this endpoint adds."""
    return Field("methods", "string", "Methods, comma-separated (\"attention,rollout\"), or \"all\"; null for the "
                 f"defaults that apply to the model. {note}", nullable=True, max_length=1000,
                 empty='name methods such as "attention,rollout", or send null')


def forward_rows(method: str, obj: Objective, steps: int) -> float:
    """Forward-pass equivalents of one method on this input (a backward counts BACKWARD): n tokens, T targets;
    integrated gradients at its first `steps` (more when completeness asks for them: then the deadline stops it)."""
    n, t = obj.n_tokens, obj.n_targets
    grad = t * (1 + BACKWARD)
    rows = {"attention_x_gradient": grad, "saliency": grad + 2 * t, "input_x_gradient": grad + 2 * t,
            "integrated_gradients": steps * grad + 1, "leave_one_out": n + 1, "leave_one_out_replaced": n + 1,
            "value_zeroing": n + 2}
    return rows.get(method, 1.0)  # attention, rollout, flow, alti, norm: one (hooked or traced) forward


def attribution_rows(names: Iterable[str], obj: Objective, steps: int) -> dict[str, float]:
    """Forward-pass equivalents of each named method on this input (forward_rows), and of the one traced and
    recomputed forward the attention-based methods share, when one of them is named."""
    rows = {name: forward_rows(name, obj, steps) for name in names}
    if any(name in rows for name in TRACED):
        rows["the verified trace"] = 2.0
    return rows


def costliest(rows: dict[str, float], n: int = 3) -> str:
    """The n parts that cost most, as "name ~rows, ..." (for a refusal's message)."""
    return ", ".join(f"{name} ~{rows[name]:.0f}" for name in sorted(rows, key=rows.__getitem__, reverse=True)[:n])


def admit(methods: Sequence[Method], obj: Objective, steps: int, row_seconds: float, deadline: float) -> None:
    """Refuse (AttnscopeError: 422) methods whose forwards cannot finish before `deadline` (time.monotonic()),
    naming the costliest and how to fit."""
    rows = attribution_rows((m.name for m in methods), obj, steps)
    total = sum(rows.values())
    seconds = total * row_seconds
    need = (f"these methods need about {total:.0f} forward passes of {obj.n_tokens} tokens ({costliest(rows)}), "
            f"about {seconds:.0f} s at the {row_seconds:.2f} s one took here")
    admit_by_deadline(seconds, deadline, need,
                      lambda _left: "name fewer or cheaper methods, lower ig_steps, shorten the text",
                      parameter="methods")


def run_attribution(service: Service, req: AttributeRequest, stop: threading.Event) -> Attribution:
    """The library's attribute_objective on the served model, admitted by its cost, stoppable between layers."""
    from attnscope.attribution.api import attribute_objective, make_settings
    from attnscope.attribution.methods import method_names, resolve
    from attnscope.attribution.objective import build_objective

    m = service.model(req.model)
    validate_tokens(service, m, req.text)
    names = method_names(req.methods)  # an unknown method: 422 before any forward
    settings = make_settings(**{k: getattr(req, k) for k in SETTINGS if getattr(req, k) is not None})
    explicit = req.methods not in (None, "all")
    with service.model_lock(m), stopping(m, stop):
        checkpoint(stop)
        obj = build_objective(m, req.text, req.target, max_length=service.max_length(m, req.max_length),
                              truncate=False)
        methods, _left_out = resolve(names, obj, explicit)  # those left out are in the record, with why
        admit(methods, obj, settings.ig_steps, timed(lambda: m.model(**obj.inputs())), req.deadline)
        return attribute_objective(obj, names, settings, explicit)


def attribute_body(service: Service, req: AttributeRequest, stop: threading.Event) -> bytes:
    """The answer: the attribution as JSON (NaN as null) and "view", the payload the page draws."""
    a = run_attribution(service, req, stop)
    body: dict[str, Any] = {**a.to_json(), "view": attribution_payload(a, raw_tokens=req.raw_tokens)}
    return json_answer(body)


def routes(settings: Settings, service: Service, run: Run, fields: list[Field]) -> list[Route]:
    """The endpoint; run(request, fn, req) is the app's pool runner (limits, deadline, errors: an AttnscopeError is
    its 422); fields: attribute_fields (the app's OpenAPI document shows the same)."""

    return [pool_route("/api/attribute", settings, run, fields, AttributeRequest, partial(attribute_body, service))]
