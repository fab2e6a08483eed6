"""The JSON endpoints that run a job on the worker pool, built one way: the body validated by its fields, the request
built with the server's deadline, the job run by the app's pool runner (its queue, memory ceiling, deadline and
disconnects; an AttnscopeError is a 422), the answer strict JSON. Used by /api/ablate, /api/patch,
/api/attribute, /api/faithfulness, /api/search, /api/qkmap and POST /api/heads."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from attnscope.numbers import finite_or_null
from attnscope.serve.fields import Field, parse_body, read_json
from attnscope.serve.settings import Settings


def json_answer(body: dict[str, Any]) -> bytes:
    """An endpoint's answer as strict JSON bytes: NaN and infinities as null, never as invalid JSON (a trace's
    arrays, where a NaN is the model's defect, go through serve.encode.to_json, which refuses them instead)."""
    return json.dumps(finite_or_null(body), ensure_ascii=False, allow_nan=False).encode("utf-8")


Run = Callable[[Request, Callable[[Any, threading.Event], bytes], Any], Awaitable[bytes]]


def pool_route(path: str, settings: Settings, run: Run, fields: list[Field], request_of: Callable[..., Any],
               answer: Callable[[Any, threading.Event], bytes]) -> Route:
    """`POST path` answered in the pool: the body validated by `fields`, the request built as
    request_of(**fields, deadline=now + the server's timeout), answer(req, stop) run by the app's pool runner `run`
    (limits, deadline, errors: an AttnscopeError is its 422), its bytes returned as JSON."""

    async def endpoint(request: Request) -> Response:
        parsed = parse_body(await read_json(request, settings.max_body_bytes), fields)
        req = request_of(**parsed, deadline=time.monotonic() + settings.timeout)
        return Response(await run(request, answer, req), media_type="application/json")

    return Route(path, endpoint, methods=["POST"], name=path.rsplit("/", 1)[-1])


__all__ = ["Run", "json_answer", "pool_route"]
