"""`POST /api/ablate` and `POST /api/patch`: interventions in the web app, as JSON.

Bounded like the other endpoints: the texts' characters (fields) and tokens (the server's max_tokens),
the pool's queue and deadline, one forward pass at a time per model. The answer is the result's
to_dict() plus, when there is a grid, "effects": the heatmap payload that assets/effects.js draws.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from attnscope.errors import AttnscopeError
from attnscope.models import Model
from attnscope.numbers import finite_or_null
from attnscope.serve.fields import Field, parse_body, read_json
from attnscope.serve.pool import checkpoint
from attnscope.serve.service import Service
from attnscope.serve.settings import Settings


@dataclass(frozen=True)
class AblateRequest:
    text: str
    model: str | None
    heads: str | None
    mode: str
    target: str | None
    each: bool


@dataclass(frozen=True)
class PatchRequest:
    clean: str
    corrupt: str
    model: str | None
    target: str | None
    contrast: str | None


def _model_field(models: Sequence[str]) -> Field:
    return Field("model", "string", "A model this server serves (GET /api/models); null for the default.",
                 nullable=True, enum=tuple(models))


def _target_field(settings: Settings, name: str, what: str) -> Field:
    return Field(name, "string", what, nullable=True, max_length=settings.max_chars)


def ablate_fields(settings: Settings, models: Sequence[str]) -> list[Field]:
    return [
        Field("text", "string", "The sentence.", required=True, max_length=settings.max_chars),
        _model_field(models),
        Field("heads", "string", "Heads to remove together, layer.head, 0-indexed: \"3.1,0.7\".", nullable=True,
              max_length=2000, empty='name heads as layer.head, such as "3.1,0.7", or send null'),
        Field("mode", "string", "zero: the heads' context set to 0; mean: to its mean over the text.",
              default="zero", enum=("zero", "mean")),
        _target_field(settings, "target", "Causal LMs: the continuation to score (default: the greedy next "
                      "token); masked LMs: the word at the mask."),
        Field("each", "boolean", "Also remove every head alone (a layer x head grid).", default=False),
    ]


def patch_fields(settings: Settings, models: Sequence[str]) -> list[Field]:
    return [
        Field("clean", "string", "The clean sentence.", required=True, max_length=settings.max_chars),
        Field("corrupt", "string", "The corrupted sentence, of the same token length.", required=True,
              max_length=settings.max_chars),
        _model_field(models),
        _target_field(settings, "target", "The clean answer token (default: the clean run's top token)."),
        _target_field(settings, "contrast", "The corrupt answer token (default: the corrupt run's top token)."),
    ]


def _validate_tokens(service: Service, m: Model, *texts: str) -> None:
    for text in texts:
        n = len(m.tokenizer(text)["input_ids"])
        if n > service.settings.max_tokens:
            raise AttnscopeError(f"the text is {n} tokens long, over this server's limit of "
                                 f"{service.settings.max_tokens}: shorten it")


def ablate_body(service: Service, req: AblateRequest, stop: threading.Event) -> bytes:
    from attnscope.interventions import ablate, parse_heads
    from attnscope.views.effects import effects_payload

    m = service.model(req.model)
    _validate_tokens(service, m, req.text)
    heads = parse_heads(req.heads) if req.heads else []
    with service.model_lock(m):
        checkpoint(stop)
        r = ablate(req.text, heads, model=m, mode=req.mode, target=req.target, each=req.each)  # type: ignore[arg-type]
    body: dict[str, Any] = r.to_dict()
    body["effects"] = effects_payload(r) if r.grid is not None else None
    return _json(body)


def patch_body(service: Service, req: PatchRequest, stop: threading.Event) -> bytes:
    from attnscope.interventions.patch import patch
    from attnscope.views.effects import effects_payload

    m = service.model(req.model)
    _validate_tokens(service, m, req.clean, req.corrupt)
    with service.model_lock(m):
        checkpoint(stop)
        r = patch(req.clean, req.corrupt, model=m, target=req.target, contrast=req.contrast)
    return _json({**r.to_dict(), "effects": effects_payload(r)})


def _json(body: dict[str, Any]) -> bytes:
    return json.dumps(finite_or_null(body), ensure_ascii=False, allow_nan=False).encode("utf-8")


Run = Callable[[Request, Callable[[Any, threading.Event], bytes], Any], Awaitable[bytes]]


def routes(settings: Settings, service: Service, run: Run, a_fields: list[Field], p_fields: list[Field]) -> list[Route]:
    """The two endpoints; run(request, fn, req) is the app's pool runner (limits, deadline, errors); a_fields and
    p_fields validate their bodies (ablate_fields, patch_fields: the app's OpenAPI document shows the same)."""

    async def ablate(request: Request) -> Response:
        req = AblateRequest(**parse_body(await read_json(request, settings.max_body_bytes), a_fields))
        body = await run(request, lambda r, stop: ablate_body(service, r, stop), req)
        return Response(body, media_type="application/json")

    async def patch(request: Request) -> Response:
        req = PatchRequest(**parse_body(await read_json(request, settings.max_body_bytes), p_fields))
        body = await run(request, lambda r, stop: patch_body(service, r, stop), req)
        return Response(body, media_type="application/json")

    return [Route("/api/ablate", ablate, methods=["POST"]), Route("/api/patch", patch, methods=["POST"])]
