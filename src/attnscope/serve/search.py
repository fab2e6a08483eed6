"""`POST /api/search`: the corpus tokens nearest to one token of a text, by what the model computes (issue 33), in
the index `attnscope serve --index INDEX` loaded (built by `attnscope index`).

The answer is `attnscope.corpus.query.search`'s, as `SearchResult.to_dict()`: the nearest tokens with their
sentences, character offsets and cosine distances, and the summary of the matches (UD part of speech, dependency
relation, positions, the tokens), plus "index", what the loaded index holds. The query text goes through the
index's own path (corpus.query), on the served model the index was built with.

Refusals, each one line: 404 when this server has no index; 422 for a model other than the index's, a layer or
head the index does not hold, a query or key search without a head, a token out of range of the text, a text over
the server's max_tokens. Bounded like the other endpoints: the text's characters, k (at most MAX_K matches), the
pool's queue and deadline, one forward of the model at a time (the search itself runs under the model's lock too:
the index's lazily verified files and the FAISS index's search width are shared state).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, NoReturn

from starlette.routing import Route

from attnscope.corpus.query import search
from attnscope.corpus.store import BY, CorpusIndex
from attnscope.errors import AttnscopeError
from attnscope.models import Model
from attnscope.serve.ablation import stopping
from attnscope.serve.endpoints import Run, json_answer, pool_route
from attnscope.serve.fields import Field, RequestError, model_field, validate_tokens
from attnscope.serve.pool import checkpoint
from attnscope.serve.service import Service
from attnscope.serve.settings import Settings

MAX_K = 200  # matches a request may ask for
NO_INDEX = ("this server has no corpus index: start it with attnscope serve --index INDEX (a directory built by "
            "attnscope index)")


@dataclass(frozen=True)
class SearchRequest:
    text: str
    token: int
    layer: int
    by: str
    head: int | None
    k: int
    exact: bool
    model: str | None
    deadline: float = math.inf  # time.monotonic() by which the answer is due (the pool's deadline)


class Corpus:
    """The loaded index and the served model it was built with."""

    def __init__(self, path: str | os.PathLike[str], service: Service) -> None:
        self.index = CorpusIndex(path)  # the manifest read and every file's size checked; sha256s on first read
        found = [m for m in service.models.values() if m.name == self.index.model]
        if not found:
            served = ", ".join(sorted({m.name for m in service.models.values()}))
            raise AttnscopeError(f"{path} was built with {self.index.model}, which this server does not serve "
                                 f"({served}): add --model {self.index.model}")
        self.model: Model = found[0]

    def describe(self) -> dict[str, Any]:
        """What the page and a client need to ask: the model, the layers and heads kept (0-indexed), the size."""
        ann = self.index.manifest.get("ann") or {}
        return {"model": self.index.model, "layers": self.index.layers, "heads": self.index.heads,
                "documents": self.index.n_documents, "tokens": self.index.n_tokens, "by": list(BY),
                "approximate": ann.get("library"), "max_k": MAX_K}


_NUMBER = {"type": "number"}
_MATCH = {"type": "object", "required": ["rank", "distance", "text", "start", "end", "token", "position"],
          "properties": {"rank": {"type": "integer"}, "row": {"type": "integer"}, "distance": _NUMBER,
                         "document": {"type": "integer"}, "where": {"type": "string"},
                         "text": {"type": "string", "description": "the match's sentence"},
                         "start": {"type": "integer"}, "end": {"type": "integer"},
                         "token": {"type": "string", "description": "text[start:end]"},
                         "position": {"type": "integer", "description": "token index in its sentence, 0-indexed"},
                         "upos": {"type": "string", "nullable": True}, "deprel": {"type": "string", "nullable": True}}}
_COUNTS = {"type": "object", "additionalProperties": {"type": "integer"}}
# The 200 answer's schema, for the OpenAPI document (serve/openapi.py).
RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["text", "token", "token_text", "layer", "by", "head", "method", "matches", "summary", "index"],
    "properties": {
        "text": {"type": "string"}, "token": {"type": "integer"}, "token_text": {"type": "string"},
        "layer": {"type": "integer"}, "by": {"type": "string", "enum": list(BY)},
        "head": {"type": "integer", "nullable": True},
        "method": {"type": "string", "description": "exact, or approximate (LIBRARY)"},
        "matches": {"type": "array", "items": _MATCH, "description": "nearest first; distance: 1 - cosine"},
        "summary": {"type": "object", "required": ["total", "upos", "deprel", "position", "token"],
                    "properties": {"total": {"type": "integer"}, "upos": _COUNTS, "deprel": _COUNTS,
                                   "position": _COUNTS, "token": _COUNTS}},
        "index": {"type": "object", "description": "what the loaded index holds: model, layers, heads (0-indexed), "
                  "documents, tokens"},
    },
}
SUMMARY = ("The corpus tokens nearest to one token of a text by what the model computes (as `attnscope search "
           "--format json`), in the index the server was started with (--index); 404 without one")
NOT_FOUND = "This server has no corpus index (start it with --index INDEX), or no such route."


def search_fields(settings: Settings, models: Sequence[str]) -> list[Field]:
    """The body of POST /api/search (validation and the OpenAPI schema alike)."""
    return [
        Field("text", "string", "The query text.", required=True, max_length=settings.max_chars),
        Field("token", "integer", "The query token, 0-indexed, special tokens included.", required=True, minimum=0,
              maximum=settings.max_tokens - 1),
        Field("layer", "integer", "The layer compared, 0-indexed: one the index holds.", required=True, minimum=0),
        Field("by", "string", "What is compared: the token's embedding (the layer's output), its attention "
              "context (every head's, merged), or one head's query or key.", default="embedding", enum=BY),
        Field("head", "integer", "by query or key: the head, 0-indexed, one the index holds (null otherwise).",
              nullable=True, minimum=0),
        Field("k", "integer", "Matches, nearest first.", default=50, minimum=1, maximum=MAX_K),
        Field("exact", "boolean", "Compare every corpus token (the reference) rather than ask the approximate index.",
              default=False),
        model_field(models),
    ]


def search_body(service: Service, corpus: Corpus, req: SearchRequest, stop: threading.Event) -> bytes:
    """The library's search on the served model (the index's unless the request names another: 422)."""
    m = corpus.model if req.model is None else service.model(req.model)
    validate_tokens(service, m, req.text)
    with service.model_lock(m), stopping(m, stop):
        checkpoint(stop)
        try:
            result = search(corpus.index, req.text, token=req.token, layer=req.layer, by=req.by, head=req.head,
                            k=req.k, model=m, exact=req.exact)
        except AttnscopeError as exc:  # the library names the index by its path: a client reads "the index"
            raise AttnscopeError(str(exc).replace(str(corpus.index.root), "the index"),
                                 parameter=exc.parameter) from exc
    return json_answer({**result.to_dict(), "index": corpus.describe()})


def load(path: str | os.PathLike[str] | None, service: Service) -> Corpus | None:
    return None if path is None else Corpus(path, service)


def no_index(*_args: Any, **_fields: Any) -> NoReturn:
    """A request to a route of the index on a server without --index: 404 (after the body's own 422s)."""
    raise RequestError(404, NO_INDEX)


def routes(settings: Settings, service: Service, run: Run, fields: list[Field], corpus: Corpus | None) -> list[Route]:
    """The endpoint; run(request, fn, req) is the app's pool runner (limits, deadline, errors: an AttnscopeError is
    its 422); fields: search_fields (the app's OpenAPI document shows the same)."""
    if corpus is None:
        return [pool_route("/api/search", settings, run, fields, no_index, no_index)]
    return [pool_route("/api/search", settings, run, fields, SearchRequest, partial(search_body, service, corpus))]
