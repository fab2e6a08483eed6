"""The decomposition methods (engineer B's modules) as registry methods: ALTI (attribution.alti), norm-based
attention (attribution.norm_based) and value zeroing (attribution.value_zeroing).

Each gives one token-to-token mixing matrix per layer (attribution.mixing.LayerMixing), rolled out over the layers
(the product, the last layer on the left). A target's scores are the rolled matrix's row of the position that
predicts it; for an encoder's pooled embedding, the mean of the rows (as mean pooling weighs them), as for raw
attention and rollout (attribution.attention.rows), taken from the top layer down without forming the rolled
matrix (attribution.attention.rolled_rows). The check is the method's own, per layer: ALTI's and norm's
vectors add up to the captured attention-block output; value zeroing's unzeroed forward equals the model's.
"""

from __future__ import annotations

import importlib

import numpy as np

from attnscope.attribution.attention import rolled_rows
from attnscope.attribution.blocks import refuse_unsupported
from attnscope.attribution.methods import Context
from attnscope.attribution.objective import Objective
from attnscope.attribution.record import Cost, MethodCheck, MethodScores
from attnscope.errors import AttnscopeError

# name -> (module, function, whether the method decomposes the whole attention block)
FUNCTIONS = {"alti": ("attnscope.attribution.alti", "alti", True),
             "norm": ("attnscope.attribution.norm_based", "norm_based", False),
             "value_zeroing": ("attnscope.attribution.value_zeroing", "value_zeroing", False)}
UNITS = {"alti": "share of the input (ALTI, rolled out)", "norm": "share of the input (||alpha f(x)||, rolled out)",
         "value_zeroing": "share of the input (value zeroing, rolled out)"}


def why_not(name: str, obj: Objective) -> str | None:
    """None where the method decomposes this model's attention; else its own one-line reason."""
    try:
        refuse_unsupported(obj.model, name, whole_block=FUNCTIONS[name][2])
    except AttnscopeError as exc:
        return str(exc)
    return None


def _run(ctx: Context, name: str) -> MethodScores:
    obj = ctx.objective
    module, function, _ = FUNCTIONS[name]
    mixing = getattr(importlib.import_module(module), function)(obj.model, obj.inputs())
    errors = np.asarray(mixing.max_error, dtype=np.float64)
    worst = float(np.nanmax(errors)) if np.isfinite(errors).any() else float("nan")
    check = MethodCheck(name="decomposition", value=worst, bound=float(mixing.bound), verified=mixing.verified,
                        detail=mixing.detail)
    return MethodScores(method=name, scores=rolled_rows(obj, mixing.matrices), unit=UNITS[name], check=check,
                        cost=Cost(forwards=max(1, int(mixing.forwards)), backwards=0, seconds=0.0),
                        settings={"layers": int(mixing.matrices.shape[0])})


def alti(ctx: Context) -> MethodScores:
    return _run(ctx, "alti")


def norm(ctx: Context) -> MethodScores:
    return _run(ctx, "norm")


def value_zeroing(ctx: Context) -> MethodScores:
    return _run(ctx, "value_zeroing")
