"""The OpenAPI 3.0 document of the JSON API, built from the same field declarations that validate."""

from __future__ import annotations

from typing import Any

from attnscope import __version__
from attnscope.serve.attribute import RESPONSE_SCHEMA as _ATTRIBUTION
from attnscope.serve.attribute import SUMMARY as _ATTRIBUTE_SUMMARY
from attnscope.serve.binary import PRECISIONS
from attnscope.serve.corpus_views import NO_HEADS as _NO_HEADS
from attnscope.serve.faithfulness import RESPONSE_SCHEMA as _FAITHFULNESS
from attnscope.serve.faithfulness import SUMMARY as _FAITHFULNESS_SUMMARY
from attnscope.serve.fields import Field, body_schema
from attnscope.serve.maps import LEVELS, QUERY
from attnscope.serve.search import NOT_FOUND as _NO_INDEX
from attnscope.serve.search import RESPONSE_SCHEMA as _SEARCH
from attnscope.serve.search import SUMMARY as _SEARCH_SUMMARY
from attnscope.stages import ARRAYS

_ERROR = {"$ref": "#/components/schemas/Error"}
_STATUS_TEXT = {
    403: "Not from this server's own page or a local client: a foreign Host or Origin, a CORS preflight, "
         "or a missing access token.",
    404: "No such route, or a trace this server no longer has (evicted or restarted): trace the text again.",
    408: "The body did not arrive within the server's body deadline.",
    413: "The request body is larger than the server's limit.",
    415: "The body is not sent as Content-Type: application/json.",
    422: "The body is not valid JSON, breaks a field's rule, the text cannot be traced, or the response "
         "would be over the server's size limit.",
    500: "An internal error: the body says only 'internal error' and a request id to find it in the log.",
    503: "Every worker is busy, the queue is full, there are too many connections, or the server is over "
         "its memory ceiling: retry after a moment.",
    504: "The request took longer than the server's deadline.",
}


def _json(schema: dict[str, Any], description: str, media: str = "application/json") -> dict[str, Any]:
    return {"description": description, "content": {media: {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    return {str(c): _json(_ERROR, _STATUS_TEXT[c]) for c in codes}


def _post(summary: str, fields: list[Field], ok: dict[str, Any], op_id: str,
          links: dict[str, Any] | None = None, media: str = "application/json") -> dict[str, Any]:
    done = {**_json(ok, "OK", media), **({"links": links} if links else {})}
    return {"post": {
        "operationId": op_id, "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": body_schema(fields)}}},
        "responses": {"200": done, **_errors(403, 408, 413, 415, 422, 500, 503, 504)},
    }}


# A traced text can then be explained or shown in the neuron view: the same text, pair, model and length
# (served from the cache, with whatever the trace computed, attention flow included).
_SAME_TEXT = {name: f"$request.body#/{name}" for name in ("text", "pair", "model", "max_length")}
_TRACE_LINKS = {"Explain": {"operationId": "explain", "requestBody": _SAME_TEXT,
                            "description": "Walk through a layer and head of the text just traced"},
                "Neuron": {"operationId": "neuron", "requestBody": _SAME_TEXT,
                           "description": "The neuron view of a layer and head of the text just traced"}}


def _binary(op: dict[str, Any]) -> dict[str, Any]:
    """A route that also answers raw float32 arrays when the request's Accept header asks for them."""
    op["post"]["responses"]["200"]["content"]["application/x-attnscope-arrays"] = {
        "schema": {"type": "string", "format": "binary"}}
    return op


def _search(fields: list[Field]) -> dict[str, Any]:
    """POST /api/search: also 404 when the server was started without a corpus index."""
    op = _post(_SEARCH_SUMMARY, fields, _SEARCH, "search")
    op["post"]["responses"]["404"] = _json(_ERROR, _NO_INDEX)
    return op


def _with_404(op: dict[str, Any], text: str) -> dict[str, Any]:
    for method in op.values():
        method["responses"]["404"] = _json(_ERROR, text)
    return op


def _get(summary: str, ok: dict[str, Any], op_id: str) -> dict[str, Any]:
    more = {"503": _json(ok, "Over the memory ceiling (the same body, status 'over the memory ceiling')")} \
        if op_id == "health" else _errors(503)
    return {"get": {"operationId": op_id, "summary": summary,
                    "responses": {"200": _json(ok, "OK"), **_errors(403, 500), **more}}}


def _obj(required: list[str], **props: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": props}


_ARRAY = _obj(
    ["axes", "shape", "dtype", "encoding", "data"],
    axes={"type": "array", "items": {"type": "string"}},
    shape={"type": "array", "items": {"type": "integer"}},
    dtype={"type": "string", "enum": ["float32"]},
    encoding={"type": "string", "enum": ["base64", "list"]},
    data={"description": "base64 text, or nested lists of numbers", "oneOf": [{"type": "string"},
                                                                                {"type": "array"}]},
)
_TOKEN = _obj(["index", "text", "id", "start", "end", "special", "word", "segment"],
              index={"type": "integer"}, text={"type": "string"}, id={"type": "integer"},
              start={"type": "integer", "nullable": True}, end={"type": "integer", "nullable": True},
              special={"type": "boolean"}, word={"type": "integer", "nullable": True},
              segment={"type": "integer"},
              decoded={"type": "string", "nullable": True,
                       "description": "the tokenizer's own decoding of the piece (' world' for 'Ġworld'); what the "
                                      "views show; null in traces saved before it"})
_CHECK = _obj(["ok", "tolerance", "max_error"], ok={"type": "boolean"}, tolerance={"type": "number"},
              max_error={"type": "number"}, unsupported={"type": "string", "nullable": True})
_TRACE = _obj(["model", "text", "tokens", "truncated", "check", "arrays"],
              model={"type": "object"}, text={"type": "string"}, pair={"type": "string", "nullable": True},
              truncated={"type": "boolean"}, tokens={"type": "array", "items": _TOKEN}, check=_CHECK,
              arrays={"type": "object", "description": f"by stage name: {', '.join(ARRAYS)}",
                      "additionalProperties": _ARRAY},
              payload={"type": "object", "description": "the views' payload, when asked for"})
_STEP = _obj(["stage", "title", "text", "shape", "arrays"], stage={"type": "string"},
             title={"type": "string"}, text={"type": "string"}, shape={"type": "string"},
             arrays={"type": "object", "additionalProperties": {"type": "array"}})
_EXPLAIN = _obj(["model", "layer", "head", "token", "tokens", "steps", "check"],
                model={"type": "object"}, layer={"type": "integer"}, head={"type": "integer"},
                token={"type": "integer", "nullable": True}, tokens={"type": "array", "items": _TOKEN},
                steps={"type": "array", "items": _STEP},
                check=_obj(["ok", "tolerance"], ok={"type": "boolean"}, tolerance={"type": "number"}))
_MODEL = _obj(["name", "architecture", "layers", "heads", "max_positions", "default", "max_length"],
              name={"type": "string"}, architecture={"type": "string"}, layers={"type": "integer"},
              heads={"type": "integer"}, max_positions={"type": "integer"}, default={"type": "boolean"},
              aliases={"type": "array", "items": {"type": "string"}}, max_length={"type": "integer"})
_HEALTH = _obj(["status"], status={"type": "string", "enum": ["ok", "over the memory ceiling"]},
               pool={"type": "object"}, cache={"type": "object"},
               models={"type": "array", "items": {"type": "string"}},
               memory=_obj(["rss", "max", "ok"], rss={"type": "integer"}, max={"type": "integer"},
                           ok={"type": "boolean"}))


_NEURON = _obj(["layer", "head", "scaling", "d_head", "encoding", "data"], layer={"type": "integer"},
               head={"type": "integer"}, scaling={"type": "number"}, d_head={"type": "integer"},
               encoding={"type": "string"}, data={"type": "string"})


def _map_route() -> dict[str, Any]:
    """GET /api/trace/{id}/map: the maps of a lazily sent trace, in the binary form (attnscope.serve.maps)."""
    def param(name: str, where: str, schema: dict[str, Any], text: str, required: bool = False) -> dict[str, Any]:
        return {"name": name, "in": where, "required": required, "schema": schema, "description": text}

    binary_body = {"description": "OK", "content": {"application/x-attnscope-arrays": {
        "schema": {"type": "string", "format": "binary"}}}}
    query = {
        "source": param("source", "query", {"type": "string", "default": "weights"}, "a source of the payload"),
        "layer": param("layer", "query", {"type": "integer", "minimum": 0}, "layer, 0-indexed (sources with layers)"),
        "head": param("head", "query", {"type": "integer", "minimum": 0}, "head, 0-indexed; absent: every head"),
        "precision": param("precision", "query", {"type": "string", "enum": list(PRECISIONS), "default": "uint8"},
                           "the values' dtype"),
        "level": param("level", "query", {"type": "string", "enum": list(LEVELS), "default": "tokens"},
                       "tokens, or words (word maps merged from the token maps; a trace with word pieces only)"),
    }
    return {"get": {
        "operationId": "map", "summary": "One map of a trace sent with \"maps\": \"lazy\" (or a layer's heads), "
        "binary (docs/serve.md): uint8 as stored, float16 or float32 exact from the trace",
        "parameters": [
            param("id", "path", {"type": "string"}, "payload.maps.trace of the POST /api/trace answer", True),
            *(query[name] for name in QUERY),  # every parameter maps.parse_query reads (KeyError if one is new)
        ],
        "responses": {"200": binary_body, **_errors(403, 404, 422, 500, 503, 504)},
    }}


_GENERATED = _obj(["event"], event={"type": "string", "enum": ["start", "token", "done", "error"],
                                    "description": "one NDJSON line each: start once (model, prompt tokens); token "
                                    "per step as it is chosen (token, probability, alternatives); then done (the "
                                    "generation view's payload, verified) or error (one line)"},
                  error={"type": "string"})
_STRINGS = {"type": "array", "items": {"type": "string"}}
_EFFECTS = _obj(["model", "kind"], model={"type": "string", "description": "the model's name"},
                kind={"type": "string", "description": "encoder, masked-lm, causal-lm or seq2seq-lm"},
                tokens=_STRINGS, clean_tokens=_STRINGS, corrupt_tokens=_STRINGS,
                heads={"type": "array", "items": {"type": "array"},
                       "description": "[layer, head], or [kind, layer, head] on encoder-decoders, 0-indexed"},
                attention={"type": "string", "nullable": True},
                grid={"type": "object", "nullable": True, "description": "measure -> [layer][head]"},
                effects={"type": "object", "nullable": True, "description": "the heatmap payload of the grids"})


# POST /api/qkmap's answer: views.qkmap.qkmap_payload's (what views/assets/qkmap.js draws), plus "index".
_POINTS = {"type": "array", "items": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}}
_QKMAP = _obj(["format", "model", "layer", "method", "colour", "colours", "tokens", "documents", "maps", "sampled",
               "total", "index"],
              format={"type": "string", "enum": ["attnscope.qkmap/1"]}, model={"type": "string"},
              layer={"type": "integer"}, method={"type": "string"}, colour={"type": "string"},
              colours={"type": "array", "items": {"type": "string"}}, title={"type": "string"},
              corpus={"type": "string"},
              tokens={"type": "array", "description": "the sampled tokens in index order: doc, position, start, end, "
                      "text (the document's characters start..end), special, upos, deprel",
                      "items": {"type": "object"}},
              documents={"type": "object", "additionalProperties": {"type": "string"},
                         "description": "document row -> its text"},
              maps={"type": "array", "description": "one per head: queries and keys [token][x, y] in one 2-D space",
                    "items": _obj(["layer", "head", "queries", "keys"], layer={"type": "integer"},
                                  head={"type": "integer"}, queries=_POINTS, keys=_POINTS,
                                  explained={"type": "array", "nullable": True, "items": {"type": "number"}},
                                  scale={"type": "number"})},
              sampled={"type": "integer"}, total={"type": "integer"},
              index={"type": "object", "description": "what the loaded index holds (as POST /api/search's)"})
# /api/heads' answer: views.heads.heads_payload's (what views/assets/heads.js draws), plus "source".
_HEADS = _obj(["format", "model", "layers", "heads", "names", "labels", "clusters", "points", "dendrogram",
               "label_counts", "source"],
              format={"type": "string", "enum": ["attnscope.heads/1"]}, model={"type": "string"},
              layers={"type": "integer"}, heads={"type": "integer"}, title={"type": "string"},
              note={"type": "string"}, causal={"type": "boolean"}, tokens={"type": "integer"},
              documents={"type": "integer"},
              names={"type": "array", "items": {"type": "string"}, "description": "layer.head, 0-indexed, by unit"},
              labels={"type": "array", "items": {"type": "array", "items": {"type": "string"}}},
              clusters={"type": "array", "items": {"type": "integer"}}, points=_POINTS,
              dendrogram={"type": "object", "description": "scipy's icoord, dcoord and leaves"},
              behaviour={"type": "object"}, relation={"type": "array"}, label_counts={"type": "object"},
              comparison={"type": "object", "nullable": True}, source={"type": "object"})
_QKMAP_SUMMARY = ("Query/key maps of one head or a layer's kept heads (AttentionViz; as attnscope qkmap) from the "
                  "index the server was started with (--index); 404 without one")
_HEADS_SUMMARY = ("The heads grouped by what they do (as attnscope heads), from the directory the server was started "
                  "with (--heads); 404 without one")


def document(trace_fields: list[Field], explain_fields: list[Field], neuron_fields: list[Field],
             generate_fields: list[Field], ablate_fields: list[Field], patch_fields: list[Field],
             attribute_fields: list[Field], faithfulness_fields: list[Field],
             search_fields: list[Field], qkmap_fields: list[Field], heads_fields: list[Field]) -> dict[str, Any]:
    """The whole OpenAPI document (valid OpenAPI 3.0.3)."""
    return {
        "openapi": "3.0.3",
        "info": {"title": "attnscope", "version": __version__,
                 "description": "Trace, verify and explain the self-attention of the served models. "
                                "Layers, heads and tokens are 0-indexed."},
        "paths": {
            "/api/trace": _post("Trace a text: tokens, verification and arrays by stage name (raw float32 "
                                "arrays instead with Accept: application/x-attnscope-arrays, docs/serve.md)",
                                trace_fields, _TRACE, "trace", _TRACE_LINKS),
            "/api/trace/{id}/map": _map_route(),
            "/api/explain": _post("Walk through one layer, head and query token step by step "
                                  "(as `attnscope explain --format json`)", explain_fields, _EXPLAIN, "explain"),
            "/api/neuron": _binary(_post("Exact float32 q, k, scores and weights of one head for the neuron view "
                                         "(attnscope.views.neuron_block; raw float32 instead with Accept: "
                                         "application/x-attnscope-arrays); with query, that query's row of q, "
                                         "context, scores and weights ([1, ...]; k and v every key's), the block "
                                         "saying query", neuron_fields, _NEURON, "neuron")),
            "/api/generate": _post("Generate with a decoder, one NDJSON line per token as it is chosen, then the "
                                   "verified generation (docs/serve.md)", generate_fields, _GENERATED, "generate",
                                   media="application/x-ndjson"),
            "/api/ablate": _post("Remove heads (zero or mean) and measure the effect on the output "
                                 "(as `attnscope ablate --format json`)", ablate_fields, _EFFECTS, "ablate"),
            "/api/patch": _post("Activation patching: each head from the clean run into the corrupt run "
                                "(as `attnscope patch --format json`)", patch_fields, _EFFECTS, "patch"),
            "/api/attribute": _post(_ATTRIBUTE_SUMMARY, attribute_fields, _ATTRIBUTION, "attribute"),
            "/api/faithfulness": _post(_FAITHFULNESS_SUMMARY, faithfulness_fields, _FAITHFULNESS, "faithfulness"),
            "/api/search": _search(search_fields),
            "/api/qkmap": _with_404(_post(_QKMAP_SUMMARY, qkmap_fields, _QKMAP, "qkmap"), _NO_INDEX),
            "/api/heads": _with_404({**_get(_HEADS_SUMMARY, _HEADS, "heads"),
                                     **_post(_HEADS_SUMMARY + "; POST cuts the dendrogram into `clusters` groups",
                                             heads_fields, _HEADS, "heads_clustered")}, _NO_HEADS),
            "/api/models": _get("The models this server serves; the default first",
                                _obj(["models"], models={"type": "array", "items": _MODEL}), "models"),
            "/healthz": _get("Liveness, the worker pool's queue and the cache", _HEALTH, "health"),
        },
        "components": {"schemas": {"Error": _obj(["error"], error={"type": "string"})}},
    }
