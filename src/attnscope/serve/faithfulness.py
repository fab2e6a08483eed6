"""`POST /api/faithfulness`: one text's faithfulness, every chosen method's deletion and insertion curves and its
metrics (issue 32, the web app's panel).

The numbers are the library's own: `faithfulness.run.example_rows` on the served model, the code `attnscope
faithfulness` runs for each document of a corpus (that text as example 0, so the random controls are the corpus
run's first example's). The answer carries those rows as they are (NaN as null), plus the curves' x axes (k / m,
k tokens removed of the m removable) and the tokens, which are removable (special tokens never are).

Bounded like /api/attribute: the text's characters (fields) and tokens (max_length, at most the server's
max_tokens; a longer text is refused, not cut), the pool's queue and deadline, one model forward at a time, every
layer of every forward checking the job's stop event; and by its cost, before any method runs: one forward of the
text and one batch of modified inputs are timed, and the attribution methods' forward-pass equivalents
(serve.attribute.attribution_rows) plus the modified inputs the metrics score (`perturbed_rows`: both curves of every
ordering, the normalised-AOPC bounds, the unperturbed check) are admitted against the request's deadline (422
naming what costs most and about how many tokens would fit).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from starlette.routing import Route

from attnscope.attribution.api import make_settings
from attnscope.attribution.methods import method_names, resolve
from attnscope.attribution.objective import Objective, build_objective
from attnscope.errors import AttnscopeError
from attnscope.faithfulness import metrics as fm
from attnscope.faithfulness import run as library
from attnscope.faithfulness.metrics import Example
from attnscope.faithfulness.perturb import DELETE, REMOVALS, Perturber
from attnscope.models import Model
from attnscope.serve.ablation import admit_by_deadline, stopping, timed
from attnscope.serve.attribute import (
    NULLABLE_NUMBER,
    attribution_rows,
    costliest,
    methods_field,
    objective_properties,
)
from attnscope.serve.endpoints import Run, json_answer, pool_route
from attnscope.serve.fields import Field, max_length_field, model_field, validate_tokens
from attnscope.serve.pool import checkpoint
from attnscope.serve.service import Service
from attnscope.serve.settings import Settings
from attnscope.stats.sources import Document

MAX_SEEDS = 10  # random orderings a request may ask for
TIMED_ROWS = (16, 64)  # modified inputs timed in two batches (a batch's rows cost several times less than one alone)
METHODS_NOTE = "Leave-one-out under the removal is always run: it is the rank agreement's reference."


@dataclass(frozen=True)
class FaithfulnessRequest:
    text: str
    model: str | None
    methods: str | None
    removal: str = DELETE
    seeds: int = 3
    max_length: int | None = None  # null: the server's max_tokens or the model's positions, the smaller
    deadline: float = math.inf  # time.monotonic() by which the answer is due (the pool's deadline)


_CURVE = {"type": "array", "items": NULLABLE_NUMBER}
_ROW = {"type": "object", "required": ["method", "check", "deletion", "insertion", "aopc", "naopc"],
        "description": "one ordering's per-example numbers, as `attnscope faithfulness` writes them to rows.jsonl "
                       "(comprehensiveness_B and sufficiency_B at B = 1, 5, 10, 20, 50%, their ERASER aggregates, "
                       "aopc, naopc, deletion_area, insertion_area, spearman_loo, kendall_loo, the curves and the "
                       "removable tokens' scores); null: NaN",
        "properties": {"method": {"type": "string"},
                       "check": {"type": "string", "description": "the method's check (PASS, FAIL, NOT VERIFIED) "
                                 "or 'control' (random_SEED, position)"},
                       "deletion": _CURVE, "insertion": _CURVE, "aopc": NULLABLE_NUMBER, "naopc": NULLABLE_NUMBER}}
# The 200 answer's schema, for the OpenAPI document (serve/openapi.py).
RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["model", "text", "kind", "description", "targets", "removal", "tokens", "deletion_x",
                 "insertion_x", "rows"],
    "properties": {
        **objective_properties("what is measured"), "text": {"type": "string"},
        "removal": {"type": "string", "enum": list(REMOVALS)},
        "special_tokens_removed": {"type": "boolean"},
        "tokens": {"type": "array", "items": {"type": "object", "required": ["index", "text", "removable"],
                                              "properties": {"index": {"type": "integer"},
                                                             "text": {"type": "string"},
                                                             "removable": {"type": "boolean"}}}},
        "deletion_x": _CURVE, "insertion_x": _CURVE,
        "rows": {"type": "array", "items": _ROW, "description": "one per method and control, the library's rows"},
        "cost": {"type": "object", "description": "seconds and modified inputs: as run, and as estimated when the "
                 "request was admitted"},
    },
}
SUMMARY = ("One text's faithfulness: every method's deletion and insertion curves and its metrics (as a row of "
           "`attnscope faithfulness`'s examples), with the random and position controls")


def faithfulness_fields(settings: Settings, models: Sequence[str]) -> list[Field]:
    """The body of POST /api/faithfulness (validation and the OpenAPI schema alike)."""
    return [
        Field("text", "string", "The text (causal LMs explain their greedy next token; encoders their pooled "
              "embedding).", required=True, max_length=settings.max_chars),
        model_field(models),
        methods_field(METHODS_NOTE),
        Field("removal", "string", "How a token is taken away, the same for every method: delete (the rest close "
              "up) or replace (the baseline token in its place). Special tokens are never removed.",
              default=DELETE, enum=REMOVALS),
        Field("seeds", "integer", "Random orderings (controls), one per seed.", default=3, minimum=1,
              maximum=MAX_SEEDS),
        max_length_field(settings),
    ]


# ---- what it costs ----------------------------------------------------------------------------------------------

def perturbed_rows(orderings: int, ex: Example, exact_tokens: int, beam: int) -> int:
    """Modified inputs faithfulness.metrics.evaluate scores for one example (at most): both curves of every
    ordering (2 (K + 1) each), the normalised-AOPC bounds (every subset of at most K removable tokens when m <=
    exact_tokens; else a best and a worst beam search, each step at most beam parents x their children), and the
    unperturbed check (1)."""
    return rows_for(orderings, ex.m, ex.min_kept, exact_tokens, beam)


def rows_for(orderings: int, m: int, min_kept: int, exact_tokens: int, beam: int) -> int:
    """perturbed_rows for m removable tokens of which min_kept always stay."""
    k = m - min_kept
    if m <= exact_tokens:
        bounds = sum(math.comb(m, j) for j in range(k + 1))
    else:
        steps = [min(min(beam, math.comb(m, s)) * (m - s), math.comb(m, s + 1)) for s in range(k)]
        bounds = 2 * sum(steps)
    return orderings * 2 * (k + 1) + bounds + 1


@dataclass(frozen=True)
class Cost:
    """What one text's faithfulness needs: attribution forwards and modified inputs, each timed here."""

    tokens: int
    attribution: dict[str, float]  # method -> forward-pass equivalents (serve.attribute.attribution_rows)
    perturbed: int  # modified inputs scored by the metrics
    row_seconds: float  # one forward of the text, alone
    perturbed_seconds: float  # one modified input, in a batch
    orderings: int = 1  # methods and controls: what `perturbed` counts, for a shorter text (`seconds(tokens)`)
    removable: int = 0  # m
    min_kept: int = 0

    def seconds(self, tokens: int | None = None) -> float:
        """The estimate at this text's length, or at `tokens` (its first tokens: the attribution's rows ~ tokens,
        the modified inputs counted again, every row's time ~ tokens)."""
        if tokens is None:
            return sum(self.attribution.values()) * self.row_seconds + self.perturbed * self.perturbed_seconds
        r = tokens / self.tokens
        m = max(self.min_kept + 1, self.removable - (self.tokens - tokens))
        rows = rows_for(self.orderings, m, self.min_kept, fm.EXACT_TOKENS, fm.BEAM)
        return sum(self.attribution.values()) * self.row_seconds * r * r + rows * self.perturbed_seconds * r


def measure_cost(obj: Objective, p: Perturber, ex: Example, names: Sequence[str], orderings: int,
                 ig_steps: int, deadline: float = math.inf) -> Cost:
    """The cost of example_rows on this objective: one forward and two small batches of modified inputs timed."""
    m = obj.model
    attribution = attribution_rows(names, obj, ig_steps)
    perturbed = perturbed_rows(orderings, ex, fm.EXACT_TOKENS, fm.BEAM)
    row = timed(lambda: m.model(**obj.inputs()))
    return Cost(tokens=obj.n_tokens, attribution=attribution, perturbed=perturbed, row_seconds=row,
                perturbed_seconds=perturbed_row_seconds(p, ex, perturbed, deadline), orderings=orderings,
                removable=ex.m, min_kept=ex.min_kept)


def perturbed_row_seconds(p: Perturber, ex: Example, perturbed: int, deadline: float) -> float:
    """Seconds per modified input in the batches the run scores them in (p.edit_tokens token rows each): batches of
    TIMED_ROWS[0] and TIMED_ROWS[1] rows timed, t(b) = overhead + b x per row, extrapolated to the run's batch (a
    short text's rows cost several times less in a batch of hundreds than in one of 16). When the larger batch
    would take more than half the time left before `deadline` (time.monotonic()), the smaller one's per-row time
    is the estimate: such a text will not fit, and timing it must not spend its deadline."""
    masks = fm.deletion_masks(fm.ordering(np.arange(ex.n_tokens, dtype=np.float64), ex.removable), ex)
    small, large = TIMED_ROWS
    times = [_timed_rows(p, masks, small)]
    if times[0] * large / small > (deadline - time.monotonic()) / 2:
        p.forwards = 0
        return times[0] / small
    times.append(_timed_rows(p, masks, large))
    p.forwards = 0  # timing only: the library's count starts from zero
    per_row = max((times[1] - times[0]) / (large - small), times[1] / large / 4)  # a noisy slope floored
    overhead = max(0.0, times[1] - large * per_row)
    run_batch = max(1, min(perturbed, p.edit_tokens // ex.n_tokens))
    return overhead / run_batch + per_row


def _timed_rows(p: Perturber, masks: np.ndarray, rows: int) -> float:
    """Seconds to score `rows` of the masks [step, token] (cycled) in one batch."""
    batch = masks[np.arange(rows) % len(masks)]  # [variant, token]
    started = time.perf_counter()
    p.scores(batch)
    return time.perf_counter() - started


def admit(cost: Cost, deadline: float) -> None:
    """Refuse (AttnscopeError: 422) a text whose faithfulness cannot finish before `deadline`
    (time.monotonic()), naming what costs most and about how many tokens would fit."""
    need = (f"measuring this text's faithfulness needs about {sum(cost.attribution.values()):.0f} forward passes of "
            f"{cost.tokens} tokens for the attributions ({costliest(cost.attribution)}) and {cost.perturbed} modified "
            f"inputs for the curves and the normalised-AOPC bounds, about {cost.seconds():.0f} s here")
    admit_by_deadline(cost.seconds(), deadline, need, lambda left: _what_fits(cost, left), parameter="text")


def _what_fits(cost: Cost, seconds: float) -> str:
    fits = max((n for n in range(2, cost.tokens) if cost.seconds(n) <= seconds), default=None)
    size = (f"about {fits} tokens (special tokens included) would fit" if fits is not None
            else "not even a few tokens would fit")
    return f"{size}; shorten the text, name fewer or cheaper methods, ask fewer seeds"


# ---- the answer -------------------------------------------------------------------------------------------------

def faithfulness_rows(service: Service, req: FaithfulnessRequest, stop: threading.Event) -> dict[str, Any]:
    """The library's example_rows for this text on the served model, admitted by its cost, stoppable."""
    m = service.model(req.model)
    validate_tokens(service, m, req.text)
    limit = service.max_length(m, req.max_length)
    names = None if req.methods is None else tuple(method_names(req.methods))  # unknown: 422 first
    settings = library.Settings(methods=names, removal=req.removal, seeds=req.seeds, max_length=limit)
    with service.model_lock(m), stopping(m, stop):
        checkpoint(stop)
        obj, ex, cost = _example(m, req, limit)
        started = time.perf_counter()
        rows = library.example_rows(m, Document(req.text, "request"), 0, settings)
        seconds = time.perf_counter() - started
    return {**_answer(req, obj, ex, rows),
            "cost": {"seconds": seconds, "modified_inputs": rows[0]["forwards"] if rows else 0,
                     "estimated_seconds": cost.seconds(), "estimated_modified_inputs": cost.perturbed}}


def _example(m: Model, req: FaithfulnessRequest, limit: int) -> tuple[Objective, Example, Cost]:
    """The objective (refusing a text over the limit rather than cutting it) and the metrics' view of it, admitted
    by cost."""
    obj = build_objective(m, req.text, max_length=limit, truncate=False)
    p = Perturber(obj, req.removal)
    ex = p.example()
    if ex.steps < 1:
        raise AttnscopeError(f"the text has {ex.m} removable token(s) (special tokens are never removed): nothing "
                             "can be taken away; give a longer text", parameter="text")
    names = list(method_names(req.methods))
    loo = library.LOO[req.removal]
    methods, _ = resolve([*names, *([] if loo in names else [loo])], obj, req.methods is not None)
    chosen = [x.name for x in methods]
    cost = measure_cost(obj, p, ex, chosen, len(chosen) + req.seeds + 1, make_settings().ig_steps, req.deadline)
    admit(cost, req.deadline)
    return obj, ex, cost


def _answer(req: FaithfulnessRequest, obj: Objective, ex: Example, rows: list[dict[str, Any]]) -> dict[str, Any]:
    removable = ex.removable.tolist()
    return {
        "model": obj.model.name, "text": req.text, "kind": obj.kind, "description": obj.description,
        "targets": list(obj.targets), "removal": req.removal, "special_tokens_removed": False,
        "tokens": [{"index": t.index, "text": t.shown, "special": t.special, "removable": r}
                   for t, r in zip(obj.tokens, removable, strict=True)],
        "deletion_x": (np.arange(ex.steps + 1) / ex.m).tolist(),
        "insertion_x": (np.arange(ex.min_kept, ex.m + 1) / ex.m).tolist(),
        "rows": rows,
    }


def faithfulness_body(service: Service, req: FaithfulnessRequest, stop: threading.Event) -> bytes:
    """The answer as strict JSON (NaN as null)."""
    body = faithfulness_rows(service, req, stop)
    return json_answer(body)


def routes(settings: Settings, service: Service, run: Run, fields: list[Field]) -> list[Route]:
    """The endpoint; run(request, fn, req) is the app's pool runner (limits, deadline, errors: an AttnscopeError is
    its 422); fields: faithfulness_fields (the app's OpenAPI document shows the same)."""

    return [pool_route("/api/faithfulness", settings, run, fields, FaithfulnessRequest,
                       partial(faithfulness_body, service))]
