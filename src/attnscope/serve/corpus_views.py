"""`POST /api/qkmap` and `GET`/`POST /api/heads`: the corpus explorer's query/key maps and heads grouped by what they
do (issue 33, parts 3 and 4) in the web app.

- `POST /api/qkmap` (with `attnscope serve --index INDEX`): the query/key maps of one kept head, or of every kept head
  of a layer as small multiples: `attnscope.views.qkmap.qkmap_payload`'s answer for the same index and arguments (the
  payload views/assets/qkmap.js draws), plus "index", what the loaded index holds.
- `GET /api/heads` (with `attnscope serve --heads DIR`, a directory written by `attnscope heads`): the heads' grouping
  as `attnscope.views.heads.heads_payload(read_groups(DIR))` (what views/assets/heads.js draws); `POST /api/heads`
  with `{"clusters": K}` cuts the dendrogram into K groups instead.

Refusals, each one line: 404 when the server has no index (no heads directory); 422 for a layer or head the index
does not hold, an unknown projection or colouring, a projection whose package is not installed (naming how to install
it), a t-SNE or UMAP the server's deadline cannot fit (`admit`: the estimate and what fits), an answer over
--max-response. A projection runs on the worker pool (its queue and deadline); one at a time per index.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from attnscope.corpus.maps import PROJECTIONS, available
from attnscope.errors import AttnscopeError
from attnscope.serve.ablation import admit_by_deadline
from attnscope.serve.endpoints import Run, json_answer, pool_route
from attnscope.serve.fields import Field, RequestError
from attnscope.serve.pool import checkpoint
from attnscope.serve.search import Corpus, no_index
from attnscope.serve.service import Service
from attnscope.serve.settings import Settings
from attnscope.views.qkmap import COLOURS, MAX_TOKENS

if TYPE_CHECKING:
    from attnscope.corpus.head_groups import HeadGroups

# A t-SNE or UMAP map's cost per head: START_SECONDS, then POINT_SECONDS per projected point (a query or a key),
# measured here: t-SNE (scikit-learn, one OpenMP thread) took 19 s for 1,000 points and 31 s for 2,000 on 2 cores
# shared at load ~7, and 10 s for 60 points at load ~10 (its first run in the process: scikit-learn's import). UMAP
# is not installed here: the same figures are assumed (umap-learn's own timings are a few times faster than t-SNE's).
# PCA takes milliseconds: not admitted.
START_SECONDS = 1.0
POINT_SECONDS = {"pca": 0.0, "tsne": 0.02, "umap": 0.02}
NO_HEADS = ("this server has no heads directory: start it with attnscope serve --heads DIR (a directory written by "
            "attnscope heads)")
JSON = "application/json"


@dataclass(frozen=True)
class QKMapRequest:
    layer: int
    head: int | None
    projection: str
    colour: str
    limit: int
    seed: int
    deadline: float = math.inf  # time.monotonic() by which the answer is due (the pool's deadline)


def qkmap_fields() -> list[Field]:
    """The body of POST /api/qkmap (validation and the OpenAPI schema alike)."""
    return [
        Field("layer", "integer", "The layer, 0-indexed: one the index keeps.", required=True, minimum=0),
        Field("head", "integer", "The head, 0-indexed, one the index keeps; null: every head the index keeps, as "
              "small multiples.", nullable=True, minimum=0),
        Field("projection", "string", "pca (always), tsne (needs scikit-learn) or umap (needs umap-learn).",
              default="pca", enum=tuple(PROJECTIONS)),
        Field("colour", "string", "What a point's colour says at first: query or key (kind), position, UD part of "
              "speech (upos) or relation (deprel); the page toggles it.", default="kind", enum=COLOURS),
        Field("limit", "integer", "Tokens sampled from the index (seeded, the same for every head).", default=500,
              minimum=1, maximum=MAX_TOKENS),
        Field("seed", "integer", "The sample's and the projection's seed.", default=0, minimum=0, maximum=2**32 - 1),
    ]


def heads_fields(units: int | None) -> list[Field]:
    """The body of POST /api/heads; units: the loaded model's heads (the most clusters), None without --heads."""
    return [Field("clusters", "integer", "Cut the dendrogram into this many groups (GET /api/heads: about the square "
                  "root of the heads).", required=True, minimum=1, maximum=units)]


def admit(req: QKMapRequest, heads: int, tokens: int, deadline: float) -> None:
    """Refuse (AttnscopeError: 422) a projection estimated to end after `deadline` (time.monotonic()), saying what
    fits: per head START_SECONDS and POINT_SECONDS per point, two points (query and key) per token."""
    per_point = POINT_SECONDS[req.projection]
    if not per_point:
        return
    seconds = heads * (START_SECONDS + per_point * 2 * tokens)

    def fix(left: float) -> str:
        fits = int((left / heads - START_SECONDS) / (per_point * 2) + 1e-9)  # 1e-9: 250 is 249.99999999999997
        return f"ask for limit at most {max(fits, 1):,}{', one head' if heads > 1 else ''} or projection pca"

    what = "one head" if heads == 1 else f"{heads} heads"
    admit_by_deadline(seconds, deadline, f"a {req.projection} map of {what} x {tokens:,} tokens ({2 * tokens:,} "
                      f"points each) takes about {seconds:.0f} s here", fix, "limit")


def qkmap_body(corpus: Corpus, lock: threading.Lock, req: QKMapRequest, stop: threading.Event) -> bytes:
    """views.qkmap.qkmap_payload's answer for the loaded index, plus what the index holds. One projection at a time
    (lock): t-SNE limits OpenMP's threads process-wide while it runs (threadpoolctl)."""
    from attnscope.views.qkmap import qkmap_payload

    with lock:
        checkpoint(stop)
        try:
            data = qkmap_payload(corpus.index, req.layer, None if req.head is None else [req.head], limit=req.limit,
                                 seed=req.seed, method=req.projection, colour=req.colour)
        except AttnscopeError as exc:  # the library names the index by its path and its own parameters
            text = str(exc).replace(str(corpus.index.root), "the index").replace("use pca", "use projection pca")
            raise AttnscopeError(text, parameter=exc.parameter) from exc
    # the corpus by its file's name: the server's directories are not the client's business
    return json_answer({**data, "corpus": Path(str(data["corpus"])).name, "index": corpus.describe()})


class Heads:
    """A finished heads pass (`attnscope heads -o DIR`) of a served model; its grouping's answer at the default cut,
    and the last cuts asked for (clusters -> the answer's bytes)."""

    def __init__(self, path: str | os.PathLike[str], service: Service) -> None:
        from attnscope.corpus.head_groups import read_groups

        self.path = Path(path)
        try:
            first = read_groups(self.path)
        except AttnscopeError as exc:
            raise AttnscopeError(f"--heads: {exc}", parameter=exc.parameter) from exc
        served = sorted({m.name for m in service.models.values()})
        if first.model not in served:
            raise AttnscopeError(f"--heads {path} was written by a pass of {first.model}, which this server does not "
                                 f"serve ({', '.join(served)}): add --model {first.model}")
        self.units = first.layers * first.heads
        # what the page and every answer say of the pass (the same for every cut)
        self.source = {"model": first.model, "layers": first.layers, "heads": first.heads,
                       "documents": first.documents, "tokens": first.tokens}
        self.default = self._encode(first)
        self.body = functools.lru_cache(maxsize=16)(self._body)

    def _body(self, clusters: int) -> bytes:
        from attnscope.corpus.head_groups import read_groups

        return self._encode(read_groups(self.path, clusters))

    def _encode(self, g: HeadGroups) -> bytes:
        from attnscope.views.heads import heads_payload

        return json_answer({**heads_payload(g), "source": self.source})


def page_corpus(corpus: Corpus | None) -> dict[str, Any] | None:
    """The page's description of the loaded index: the search's, the projections installed, the most tokens a map
    samples."""
    return None if corpus is None else {**corpus.describe(), "projections": available(), "max_qkmap_tokens": MAX_TOKENS}


def load_heads(path: str | os.PathLike[str] | None, service: Service) -> Heads | None:
    return None if path is None else Heads(path, service)


def _sized(body: bytes, settings: Settings) -> bytes:
    limit = settings.max_response_bytes
    if len(body) > limit:
        raise AttnscopeError(f"the answer would be {len(body) / 2**20:.1f} MiB, over the server's "
                             f"{limit / 2**20:g} MiB (--max-response): ask for fewer tokens (limit) or one head",
                             parameter="limit")
    return body


def admitted(corpus: Corpus | None, **fields: Any) -> QKMapRequest:
    """A POST /api/qkmap request, refused before the pool: 404 without an index; 422 for a t-SNE or UMAP map the
    request's deadline cannot fit (a layer, head or projection the index or server lacks: the library's 422)."""
    if corpus is None:
        no_index()
    req = QKMapRequest(**fields)
    held = [h for h in corpus.index.heads if req.head is None or h == req.head]
    if req.projection in available() and held and req.layer in corpus.index.layers:
        try:
            admit(req, len(held), min(req.limit, corpus.index.n_tokens), req.deadline)
        except AttnscopeError as exc:
            raise RequestError(422, str(exc)) from exc
    return req


def loaded_heads(heads: Heads | None) -> Heads:
    """The server's heads pass; 404 without --heads."""
    if heads is None:
        raise RequestError(404, NO_HEADS)
    return heads


def cut(heads: Heads | None, *, clusters: int, deadline: float) -> int:
    """A POST /api/heads request's clusters, checked against the loaded pass (404 without one)."""
    units = loaded_heads(heads).units
    if clusters > units:  # the field's maximum says so too; a server without --heads has none
        raise RequestError(422, f"field 'clusters' must be from 1 to {units} (the model's heads)")
    return clusters


def routes(settings: Settings, run: Run, qk_fields: list[Field], hd_fields: list[Field], corpus: Corpus | None,
           heads: Heads | None) -> list[Route]:
    """The endpoints; run(request, fn, req) is the app's pool runner (limits, deadline, errors: an AttnscopeError is
    its 422); the fields are the app's OpenAPI document's."""
    lock = threading.Lock()

    def qkmap_answer(req: QKMapRequest, stop: threading.Event) -> bytes:
        if corpus is None:  # refused before: admitted
            no_index()
        return _sized(qkmap_body(corpus, lock, req, stop), settings)

    async def heads_get(_request: Request) -> Response:
        return Response(loaded_heads(heads).default, media_type=JSON)

    return [pool_route("/api/qkmap", settings, run, qk_fields, functools.partial(admitted, corpus), qkmap_answer),
            Route("/api/heads", heads_get, methods=["GET"]),
            pool_route("/api/heads", settings, run, hd_fields, functools.partial(cut, heads),
                       lambda k, _stop: loaded_heads(heads).body(k))]
