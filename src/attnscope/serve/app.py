"""The Starlette app: routes, limits, the worker pool and errors as one-line JSON.

Every refusal is `{"error": "<one line>"}` with its status: 403 not this server's page or
client (serve.guard), 408 body too slow, 413 body too large, 415 not JSON, 422 bad JSON or
fields or an untraceable text or a job too costly for the deadline or the memory ceiling, 503 queue
full or memory ceiling (and, from serve.connections, the connection cap), 504 past the deadline,
404/405; 500 says only "internal error" and the request id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import torch
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from attnscope.attribution.objective import kind_of
from attnscope.errors import AttnscopeError
from attnscope.serve import binary, corpus_views, maps, memory, page, search, wordmaps
from attnscope.serve.api import (
    ExplainRequest,
    NeuronRequest,
    TraceRequest,
    explain_fields,
    head_fields,
    trace_fields,
)
from attnscope.serve.attribute import attribute_fields
from attnscope.serve.attribute import routes as attribute_routes
from attnscope.serve.faithfulness import faithfulness_fields
from attnscope.serve.faithfulness import routes as faithfulness_routes
from attnscope.serve.fields import RequestError, parse_body, read_json
from attnscope.serve.generate import GenerateRequest, generate_fields, stream_generation
from attnscope.serve.guard import Guard
from attnscope.serve.interventions import ablate_fields, patch_fields
from attnscope.serve.interventions import routes as intervention_routes
from attnscope.serve.openapi import document
from attnscope.serve.pool import Cancelled, InferencePool, PoolBusy, PoolTimeout
from attnscope.serve.service import Service
from attnscope.serve.settings import Settings
from attnscope.tokens import shortest_max_length

log = logging.getLogger(__name__)
JSON = "application/json"


class Server:
    """The endpoints, bound to one service (models and cache) and one inference pool."""

    def __init__(self, settings: Settings, index: str | os.PathLike[str] | None = None,
                 heads_dir: str | os.PathLike[str] | None = None) -> None:
        self.settings = settings
        if settings.threads is not None:
            # the server owns its process; several busy torch threads on a shared CPU spin rather than work
            torch.set_num_threads(settings.threads)
        memory.tune()
        self.service = Service(settings)
        self.pool = InferencePool(settings.workers, settings.queue, settings.timeout)
        models = list(dict.fromkeys(self.service.models.values()))
        layers = max(m.n_layers for m in models)
        heads = max(m.n_heads for m in models)
        least = min(shortest_max_length(m.tokenizer, pair=False) for m in models)
        self.trace_fields = trace_fields(settings, self.service.names, least)
        self.explain_fields = explain_fields(settings, self.service.names, layers, heads, least)
        self.neuron_fields = head_fields(settings, self.service.names, layers, heads, least)
        self.generate_fields = generate_fields(settings, self.service.names)  # POST /api/generate
        self.ablate_fields = ablate_fields(settings, self.service.names)  # POST /api/ablate
        self.patch_fields = patch_fields(settings, self.service.names)  # POST /api/patch
        self.attribute_fields = attribute_fields(settings, self.service.names)  # POST /api/attribute
        self.faithfulness_fields = faithfulness_fields(settings, self.service.names)  # POST /api/faithfulness
        self.search_fields = search.search_fields(settings, self.service.names)  # POST /api/search
        self.corpus = search.load(index, self.service)  # attnscope serve --index: the corpus search's index
        self.heads = corpus_views.load_heads(heads_dir, self.service)  # attnscope serve --heads: a heads pass
        self.qkmap_fields = corpus_views.qkmap_fields()  # POST /api/qkmap
        self.heads_fields = corpus_views.heads_fields(self.heads.units if self.heads else None)  # POST /api/heads
        self.openapi = document(self.trace_fields, self.explain_fields, self.neuron_fields, self.generate_fields,
                                self.ablate_fields, self.patch_fields, self.attribute_fields,
                                self.faithfulness_fields, self.search_fields, self.qkmap_fields, self.heads_fields)
        self.page, self.page_policy = page.render(self._page_models(), settings.max_chars,
                                                  corpus_views.page_corpus(self.corpus),
                                                  self.heads.source if self.heads else None)

    def _page_models(self) -> list[dict[str, Any]]:
        """The served models as the page lists them, each with what attribution explains for it (the panels ask
        an encoder for no target and a head's link for its attention alone)."""
        out = []
        for info in self.service.model_list():
            try:
                kind: str | None = kind_of(self.service.model(info["name"]))
            except AttnscopeError:  # a decoder without its head: nothing to attribute
                kind = None
            out.append({**info, "attribution": kind})
        return out

    async def trace(self, request: Request) -> Response:
        data = await read_json(request, self.settings.max_body_bytes)
        wants = binary.accepts(request.headers.get("accept"))  # raw float32 arrays, else JSON as before
        req = TraceRequest(**parse_body(data, self.trace_fields), binary=wants)
        body = await self._run(request, self.service.trace_body, req)
        return Response(body, media_type=binary.MEDIA_TYPE if wants else JSON, headers={"Vary": "Accept"})

    async def map(self, request: Request) -> Response:
        """GET /api/trace/{id}/map: one map (or a layer's heads) of a lazily sent trace (attnscope.serve.maps)."""
        kept = self.service.maps.get(request.path_params["id"])
        if kept is None:
            raise RequestError(404, f"this server no longer has trace {request.path_params['id'][:16]!r} "
                               "(evicted or restarted): trace the text again")
        try:
            q = maps.parse_query(dict(request.query_params), kept)
            maps.validate_size(kept, q, self.settings.max_response_bytes)
        except AttnscopeError as exc:
            raise RequestError(422, str(exc)) from exc
        headers = {"Cache-Control": "private, max-age=3600"}  # the id names the text: its maps never change
        if q.precision == "uint8" and q.level == "words":  # merged from the stored codes: no forward pass
            body = await self._run(request, lambda r, _stop: wordmaps.stored_body(*r), (kept, q))
            return Response(body, media_type=binary.MEDIA_TYPE, headers=headers)
        if q.precision == "uint8":  # as stored: no forward pass, no new quantization
            return Response(maps.stored_body(kept, q), media_type=binary.MEDIA_TYPE, headers=headers)
        body = await self._run(request, self.service.exact_map, (kept, q))
        return Response(body, media_type=binary.MEDIA_TYPE, headers=headers)

    async def explain(self, request: Request) -> Response:
        data = await read_json(request, self.settings.max_body_bytes)
        req = ExplainRequest(**parse_body(data, self.explain_fields))
        return Response(await self._run(request, self.service.explain_body, req), media_type=JSON)

    async def neuron(self, request: Request) -> Response:
        data = await read_json(request, self.settings.max_body_bytes)
        wants = binary.accepts(request.headers.get("accept"))  # the block's stages as raw float32 (serve.rows)
        req = NeuronRequest(**parse_body(data, self.neuron_fields), binary=wants)
        body = await self._run(request, self.service.neuron_body, req)
        return Response(body, media_type=binary.MEDIA_TYPE if wants else JSON, headers={"Vary": "Accept"})

    async def generate(self, request: Request) -> Response:
        """NDJSON, one line per generated token as it is written (attnscope.serve.generate)."""
        data = await read_json(request, self.settings.max_body_bytes)
        req = GenerateRequest(**parse_body(data, self.generate_fields))
        self._validate_memory()
        return await stream_generation(self.pool, self.service, req)

    async def models(self, _request: Request) -> Response:
        return JSONResponse({"models": self.service.model_list()})

    async def health(self, _request: Request) -> Response:
        rss, ceiling = memory.rss_bytes(), self.settings.max_memory_bytes
        ok = rss <= ceiling
        return JSONResponse({"status": "ok" if ok else "over the memory ceiling", "models": self.service.names,
                             "pool": self.pool.stats(), "cache": self.service.cache.stats(),
                             "maps": self.service.maps.stats(),
                             "memory": {"rss": rss, "max": ceiling, "ok": ok}}, status_code=200 if ok else 503)

    async def schema(self, _request: Request) -> Response:
        return JSONResponse(self.openapi)

    async def index(self, _request: Request) -> Response:
        return HTMLResponse(self.page, headers={"Content-Security-Policy": self.page_policy,
                                                "X-Content-Type-Options": "nosniff"})

    async def _run(self, request: Request, fn: Callable[[Any, threading.Event], bytes], req: Any) -> bytes:
        """fn(req, stop) on the pool, within the memory ceiling; dropped or stopped if the client leaves."""
        self._validate_memory()
        job = asyncio.ensure_future(self.pool.run(fn, req))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({job, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not job.done():  # the client left: the job is dropped if queued, stopped if running
                job.cancel()
        if not job.done():
            await asyncio.wait({job})
            raise RequestError(499, "the client closed the connection")
        try:
            return job.result()
        except PoolBusy as exc:
            raise RequestError(503, f"{exc}: retry in a moment") from exc
        except PoolTimeout as exc:
            raise RequestError(504, f"{exc}: try a shorter text or a smaller max_length") from exc
        except AttnscopeError as exc:
            raise RequestError(422, str(exc)) from exc
        except Cancelled as exc:
            raise RequestError(504, f"{exc}: try a shorter text or a smaller max_length") from exc

    def _validate_memory(self) -> None:
        """Over the ceiling: give back what is already free (cycles collected, the heap trimmed); still over, empty
        the caches and give memory back; still over, refuse (503)."""
        ceiling = self.settings.max_memory_bytes
        if memory.rss_bytes() <= ceiling:
            return
        memory.release(collect=True)
        if memory.rss_bytes() <= ceiling:
            return
        self.service.cache.clear()
        self.service.maps.clear()  # a page showing one of them is told to trace again (404)
        memory.release()
        rss = memory.rss_bytes()
        if rss > ceiling:
            log.warning("resident memory %d MiB is over the ceiling of %d MiB", rss >> 20, ceiling >> 20)
            raise RequestError(503, f"the server is over its memory ceiling ({rss >> 20} of {ceiling >> 20} MiB): "
                               "retry in a moment")


async def _disconnected(request: Request) -> None:
    """Return once the client has hung up (the body is read: receive() now waits for the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _request_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestError)
    headers = {"Retry-After": "1"} if exc.status == 503 else {"Connection": "close"} if exc.status == 408 else None
    return JSONResponse({"error": exc.message}, status_code=exc.status, headers=headers)


async def _http_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)


def create_app(settings: Settings | None = None, index: str | os.PathLike[str] | None = None,
               heads: str | os.PathLike[str] | None = None) -> Starlette:
    """The web app: the page at /, the JSON API under /api, /healthz and /openapi.json.

    Loads every served model now, so a bad model name fails here (AttnscopeError); index: a corpus index built by
    `attnscope index` for POST /api/search and /api/qkmap (built with a served model, else AttnscopeError); heads: a
    directory written by `attnscope heads` for /api/heads (a served model's, else AttnscopeError).
    """
    server = Server(settings or Settings(), index, heads)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        server.pool.shutdown()

    routes = [
        Route("/", server.index, methods=["GET"]),
        Route("/api/trace", server.trace, methods=["POST"]),
        Route("/api/trace/{id}/map", server.map, methods=["GET"]),
        Route("/api/explain", server.explain, methods=["POST"]),
        Route("/api/neuron", server.neuron, methods=["POST"]),
        Route("/api/generate", server.generate, methods=["POST"]),
        *intervention_routes(server.settings, server.service, server._run, server.ablate_fields,
                             server.patch_fields),  # /api/ablate, /api/patch
        *attribute_routes(server.settings, server.service, server._run, server.attribute_fields),  # /api/attribute
        *faithfulness_routes(server.settings, server.service, server._run, server.faithfulness_fields),
        *search.routes(server.settings, server.service, server._run, server.search_fields, server.corpus),
        *corpus_views.routes(server.settings, server._run, server.qkmap_fields, server.heads_fields, server.corpus,
                             server.heads),  # /api/qkmap, /api/heads
        Route("/api/models", server.models, methods=["GET"]),
        Route("/healthz", server.health, methods=["GET"]),
        Route("/openapi.json", server.schema, methods=["GET"]),
    ]
    handlers = {RequestError: _request_error, HTTPException: _http_error}  # anything else: the guard's 500
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan,  # type: ignore[arg-type]
                    middleware=[Middleware(Guard, settings=server.settings)])
    app.state.server = server
    return app
