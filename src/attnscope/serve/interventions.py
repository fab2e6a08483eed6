"""`POST /api/ablate` and `POST /api/patch`: interventions in the web app, as JSON.

Bounded like the other endpoints: the texts' characters (fields) and tokens (max_length, at most the server's
max_tokens), the pool's queue and deadline, one forward pass at a time per model; and by their cost
(attnscope.serve.ablation): admitted against the deadline, run in batches under the memory ceiling, stopped
when the client leaves or the deadline passes. Encoder-decoders name heads as kind:layer.head (cross:1.2) and
their `each` grid's kind with `attention`, as `attnscope ablate` does. The answer is the result's to_dict()
plus, when there is a grid, "effects": the heatmap payload that assets/effects.js draws.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from starlette.routing import Route

from attnscope.errors import AttnscopeError
from attnscope.interventions import ablate
from attnscope.interventions.ablate import Ablation, ablation_result
from attnscope.interventions.effects import outputs, prepare
from attnscope.interventions.gates import mean_contexts, validate_heads
from attnscope.interventions.patch import patch
from attnscope.interventions.seq2seq import KINDS, AnyHead, layout, parse_kind_heads, seq2seq_inputs
from attnscope.models import Model
from attnscope.serve.ablation import admit, batch_rows, grid_in_batches, measure, row_bytes, stopping
from attnscope.serve.endpoints import Run, json_answer, pool_route
from attnscope.serve.fields import (
    Field,
    max_length_field,
    model_field,
    validate_tokens,
)
from attnscope.serve.pool import checkpoint
from attnscope.serve.seq2seq import is_seq2seq
from attnscope.serve.service import Service
from attnscope.serve.settings import Settings
from attnscope.views.effects import effects_payload


@dataclass(frozen=True)
class AblateRequest:
    text: str
    model: str | None
    heads: str | None
    mode: str
    target: str | None
    each: bool
    attention: str | None = None  # encoder-decoders with each: the kind of attention of the grid
    max_length: int | None = None  # null: the server's max_tokens or the model's positions, the smaller
    deadline: float = math.inf  # time.monotonic() by which the answer is due (the pool's deadline)


@dataclass(frozen=True)
class PatchRequest:
    clean: str
    corrupt: str
    model: str | None
    target: str | None
    contrast: str | None
    max_length: int | None = None
    deadline: float = math.inf


def _target_field(settings: Settings, name: str, what: str) -> Field:
    return Field(name, "string", what, nullable=True, max_length=settings.max_chars)


def ablate_fields(settings: Settings, models: Sequence[str]) -> list[Field]:
    return [
        Field("text", "string", "The sentence (encoder-decoders: the source).", required=True,
              max_length=settings.max_chars),
        model_field(models),
        Field("heads", "string", "Heads to remove together, layer.head, 0-indexed: \"3.1,0.7\"; encoder-decoders: "
              f"kind:layer.head with kind {', '.join(KINDS)}: \"cross:1.2,encoder:0.3\".", nullable=True,
              max_length=2000, empty='name heads as layer.head, such as "3.1,0.7", or send null'),
        Field("mode", "string", "zero: the heads' context set to 0; mean: to its mean over the text.",
              default="zero", enum=("zero", "mean")),
        _target_field(settings, "target", "Causal LMs: the continuation to score (default: the greedy next "
                      "token); masked LMs: the word at the mask; encoder-decoders: the target, teacher-forced "
                      "(required)."),
        Field("each", "boolean", "Also remove every head alone (a layer x head grid). Refused (422) when it cannot "
              "finish before the server's deadline, saying how many heads or tokens would.", default=False),
        Field("attention", "string", "Encoder-decoders with each: the kind of attention whose heads the grid "
              "removes.", nullable=True, enum=KINDS),
        max_length_field(settings),
    ]


def patch_fields(settings: Settings, models: Sequence[str]) -> list[Field]:
    return [
        Field("clean", "string", "The clean sentence.", required=True, max_length=settings.max_chars),
        Field("corrupt", "string", "The corrupted sentence, of the same token length.", required=True,
              max_length=settings.max_chars),
        model_field(models),
        _target_field(settings, "target", "The clean answer token (default: the clean run's top token)."),
        _target_field(settings, "contrast", "The corrupt answer token (default: the corrupt run's top token)."),
        max_length_field(settings),
    ]


def ablate_body(service: Service, req: AblateRequest, stop: threading.Event) -> bytes:
    m = service.model(req.model)
    validate_tokens(service, m, req.text)
    heads = parse_kind_heads(req.heads) if req.heads else []
    with service.model_lock(m), stopping(m, stop):
        checkpoint(stop)
        r = _ablate(service, m, req, heads)
    body: dict[str, Any] = r.to_dict()
    body["effects"] = effects_payload(r) if r.grid is not None else None
    return json_answer(body)


def _ablate(service: Service, m: Model, req: AblateRequest, heads: list[AnyHead]) -> Ablation:
    """The library's ablate; an each grid admitted by its cost first, and on a one-kind model run in batches."""
    n = service.max_length(m, req.max_length)
    if not req.each:
        return ablate(req.text, heads, model=m, mode=req.mode, target=req.target,  # type: ignore[arg-type]
                      max_length=n, attention=req.attention)
    if is_seq2seq(m):
        return _seq2seq_grid(service, m, req, heads, n)
    return _grid(service, m, req, heads, n)


def _seq2seq_grid(service: Service, m: Model, req: AblateRequest, heads: list[AnyHead], n: int) -> Ablation:
    """An encoder-decoder's grid: one batch, admitted by time and memory (no attention: the library's 422)."""
    if req.attention in KINDS:
        inputs, _tokens, _labels = seq2seq_inputs(m, req.text, req.target, n)
        layers, n_heads = layout(m)[req.attention]
        tokens = int(inputs["input_ids"].shape[1] + inputs["decoder_input_ids"].shape[1])
        cost = measure(lambda k: m.model(**{key: v.expand(k, -1) for key, v in inputs.items()}),
                       2 + layers * n_heads, tokens, row_bytes(m, tokens), req.deadline)
        admit(cost, req.deadline, f"ablating each {req.attention} head", split=False,
              ceiling=service.settings.max_memory_bytes)
    return ablate(req.text, heads, model=m, mode=req.mode, target=req.target, each=True,  # type: ignore[arg-type]
                  max_length=n, attention=req.attention)


def _grid(service: Service, m: Model, req: AblateRequest, heads: list[AnyHead], n: int) -> Ablation:
    """A one-kind model's grid: admitted by time, run in batches under the memory ceiling."""
    if req.attention is not None:
        raise AttnscopeError(f"attention names a kind of an encoder-decoder's attention; {m.name} has one kind: "
                             "leave it out", parameter="attention")
    if any(len(h) != 2 for h in heads):
        raise AttnscopeError(f"{m.name} has one kind of attention: write heads as layer.head, without a kind",
                             parameter="heads")
    chosen = validate_heads(m, heads) if heads else []  # type: ignore[arg-type]
    probe = prepare(m, req.text, req.target, n)
    ceiling = service.settings.max_memory_bytes
    cost = measure(lambda k: outputs(probe, probe.rows(k), None), 1 + bool(chosen) + m.n_layers * m.n_heads,
                   probe.n_tokens, row_bytes(m, probe.n_tokens), req.deadline)
    admit(cost, req.deadline, f"ablating each of the {m.n_layers * m.n_heads} heads", split=True, ceiling=ceiling)
    source = mean_contexts(m, probe.inputs) if req.mode == "mean" else None
    fx = grid_in_batches(probe, chosen, source, batch_rows(cost, ceiling))
    return ablation_result(m, probe, req.mode, chosen, fx, True)  # type: ignore[arg-type]


def patch_body(service: Service, req: PatchRequest, stop: threading.Event) -> bytes:
    m = service.model(req.model)
    validate_tokens(service, m, req.clean, req.corrupt)
    n = service.max_length(m, req.max_length)
    with service.model_lock(m), stopping(m, stop):
        checkpoint(stop)
        probe = prepare(m, req.clean, None, n)
        cost = measure(lambda k: outputs(probe, probe.rows(k), None), 2 + 2 * m.n_layers * m.n_heads,
                       probe.n_tokens, row_bytes(m, probe.n_tokens), req.deadline)
        admit(cost, req.deadline, "patching every head both ways", split=False,
              ceiling=service.settings.max_memory_bytes)
        r = patch(req.clean, req.corrupt, model=m, target=req.target, contrast=req.contrast, max_length=n)
    return json_answer({**r.to_dict(), "effects": effects_payload(r)})


def routes(settings: Settings, service: Service, run: Run, a_fields: list[Field], p_fields: list[Field]) -> list[Route]:
    """The two endpoints; run(request, fn, req) is the app's pool runner (limits, deadline, errors); a_fields and
    p_fields validate their bodies (ablate_fields, patch_fields: the app's OpenAPI document shows the same)."""
    return [pool_route("/api/ablate", settings, run, a_fields, AblateRequest, partial(ablate_body, service)),
            pool_route("/api/patch", settings, run, p_fields, PatchRequest, partial(patch_body, service))]
