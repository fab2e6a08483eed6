"""The registry of attribution methods: name -> Method (its module, paper, cost, which models it applies to).

A method is a function of a Context (the objective, the settings, what methods share) returning MethodScores.
An unknown method, or one that does not apply to the model, is a one-line AttnscopeError (the CLI's exit 2).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from attnscope.attribution.objective import CAUSAL, ENCODER, SEQ2SEQ, Objective
from attnscope.attribution.record import Cost, MethodScores
from attnscope.errors import AttnscopeError


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What the methods may be told; each field's flag is its name with dashes (--ig-max-steps)."""

    layer: int | None = None  # raw attention, attention x gradient, rollout: 0-indexed (default: the last)
    head: int | None = None  # raw attention, attention x gradient: 0-indexed (default: the mean of the heads)
    ig_steps: int = 32  # integrated gradients: the first number of steps tried (trapezoid-rule points)
    ig_max_steps: int = 512  # ... doubled until completeness holds or this cap is reached
    ig_tolerance: float = 0.01  # completeness wanted: |sum - (f(x) - f(baseline))| / |f(x) - f(baseline)|
    max_flow_tokens: int = 64  # attention flow's budget (its cost grows like tokens^4)
    max_perturb_tokens: int = 256  # leave-one-out's budget (tokens + 1 forwards of tokens each)
    grad_tokens: int = 1024  # token rows per batched forward and backward (integrated gradients' steps)
    edit_tokens: int = 4096  # token rows per batched forward without gradients (leave-one-out)


@dataclass(eq=False)
class Context:
    """One attribution run: the objective, the settings, and what several methods share (attention.shared_trace
    keeps the verified trace here)."""

    objective: Objective
    settings: Settings
    shared: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Method:
    """One attribution method. kinds: the objectives it applies to; why_not names why it does not (per kind)."""

    name: str
    module: str  # attnscope.attribution.<module>: run is <module>.<function>
    function: str
    paper: str
    cost: str  # in forwards (F) and backwards (B) of the input, n tokens, T targets
    why_not: dict[str, str]  # kind -> why the method does not apply to it; the kinds absent here it applies to
    per_family: bool = False  # also ask the module's why_not(name, objective) (a family it cannot decompose)
    by_kind: dict[str, str] = field(default_factory=dict)  # kind -> another module with the same function for it

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of objective it applies to."""
        return tuple(k for k in (CAUSAL, SEQ2SEQ, ENCODER) if k not in self.why_not)

    def supports(self, obj: Objective) -> str | None:
        """None when the method applies to this objective's model; else the reason, one line."""
        if obj.kind not in self.why_not:
            if not self.per_family:
                return None
            reason: str | None = importlib.import_module(self.module).why_not(self.name, obj)
            return reason
        return f"{self.name} does not apply to {obj.model.name} ({obj.model.architecture}): {self.why_not[obj.kind]}"

    def run(self, ctx: Context) -> MethodScores:
        """The method's scores, with the seconds it took."""
        module = self.by_kind.get(ctx.objective.kind, self.module)
        fn: Callable[[Context], MethodScores] = getattr(importlib.import_module(module), self.function)
        start = time.perf_counter()
        out = fn(ctx)
        cost = Cost(forwards=out.cost.forwards, backwards=out.cost.backwards, seconds=time.perf_counter() - start)
        return replace(out, cost=cost)


_ATTN = "attnscope.attribution.attention"
_GRAD = "attnscope.attribution.gradients"
_LOO = "attnscope.attribution.leave_one_out"
_MIX = "attnscope.attribution.decomposition"
_S2S = {SEQ2SEQ: "attnscope.attribution.seq2seq_attention"}  # the encoder-decoder's three kinds of attention
_ONE_STACK = ("attention flow is a max-flow through one stack's layered graph (Abnar & Zuidema 2020), and an "
              "encoder-decoder's encoder output feeds every decoder layer at once through cross-attention: use "
              "rollout, which follows the encoder and then the decoder's self- and cross-attention")
_ONE_BLOCK = ("ALTI, norm-based attention and value zeroing decompose one stack's attention blocks as their papers "
              "do; an encoder-decoder's decoder layers also mix in the encoder's output through cross-attention, "
              "which needs the encoder-decoder extension (ALTI+, Ferrando et al. 2022), not built here: use rollout, "
              "a gradient or a leave-one-out method")
_AT_MAXIMUM = ("what is explained for an encoder is the cosine similarity of its pooled embedding with the unperturbed "
               "one, which is at its maximum (1) at the input itself, so its gradient there is 0 up to rounding and "
               "says nothing; use integrated_gradients (a path from a baseline) or leave_one_out")
_NOT_ONE = {SEQ2SEQ: _ONE_BLOCK}
_ALL: dict[str, str] = {}
_LM = {ENCODER: _AT_MAXIMUM}

METHODS: dict[str, Method] = {m.name: m for m in (
    Method("attention", _ATTN, "raw_attention", "the attention weights (Bahdanau et al. 2015; Jain & Wallace 2019)",
           "1 F (the verified trace)", _ALL, by_kind=_S2S),
    Method("rollout", _ATTN, "rollout", "attention rollout (Abnar & Zuidema 2020; encoder-decoders: through the "
           "encoder, then the decoder's self- and cross-attention, after Chefer, Gur & Wolf 2021)",
           "1 F (the verified trace)", _ALL, by_kind=_S2S),
    Method("flow", _ATTN, "flow", "attention flow (Abnar & Zuidema 2020)",
           "1 F + n^2 max-flows (refused past max_flow_tokens)", {SEQ2SEQ: _ONE_STACK}),
    Method("attention_x_gradient", _ATTN, "attention_x_gradient",
           "attention x gradient (Serrano & Smith 2019; Chefer et al. 2021's A * dA)", "1 F + T B (+ the trace)",
           {ENCODER: _AT_MAXIMUM}, by_kind=_S2S),
    Method("saliency", _GRAD, "saliency", "saliency, the gradient norm (Simonyan et al. 2014; Li et al. 2016)",
           "T (F + B) + 2T F (the finite-difference check)", _LM),
    Method("input_x_gradient", _GRAD, "input_x_gradient", "input x gradient (Shrikumar et al. 2016)",
           "T (F + B) + 2T F (the finite-difference check)", _LM),
    Method("integrated_gradients", _GRAD, "integrated_gradients",
           "integrated gradients (Sundararajan, Taly & Yan 2017)",
           "T x (steps tried) (F + B) + 1 F (the baseline)", _ALL),
    Method("leave_one_out", _LOO, "removed", "leave-one-out, the token removed (Li, Monroe & Jurafsky 2016)",
           "n + 1 F, batched", _ALL),
    Method("leave_one_out_replaced", _LOO, "replaced",
           "leave-one-out, the token replaced by the baseline token (Li, Monroe & Jurafsky 2016)",
           "n + 1 F, batched", _ALL),
    Method("alti", _MIX, "alti", "ALTI (Ferrando, Gallego & Costa-jussa 2022), rolled out over layers",
           "1 F (hooks on the real forward)", _NOT_ONE, per_family=True),
    Method("norm", _MIX, "norm", "norm-based attention ||alpha f(x)|| (Kobayashi et al. 2020), rolled out",
           "1 F (hooks on the real forward)", _NOT_ONE, per_family=True),
    Method("value_zeroing", _MIX, "value_zeroing", "value zeroing (Mohebbi et al. 2023), rolled out",
           "2 F + n single-layer runs per layer, batched", _NOT_ONE, per_family=True),
)}
DEFAULT_METHODS = ("attention", "rollout", "attention_x_gradient", "norm", "alti", "value_zeroing", "saliency",
                   "input_x_gradient", "integrated_gradients", "leave_one_out", "leave_one_out_replaced")


def method_names(spec: str | Sequence[str] | None) -> list[str]:
    """"all", None (the defaults), "a,b" or a list -> known method names, in order, once each."""
    if spec is None:
        return list(DEFAULT_METHODS)
    names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else [str(s).strip() for s in spec]
    if names == ["all"]:
        return list(METHODS)
    unknown = [n for n in names if n not in METHODS]
    if unknown or not names:
        raise AttnscopeError(f"unknown attribution method {(unknown or [''])[0]!r}: choose from "
                             f"{', '.join(METHODS)}, or all", parameter="methods")
    return list(dict.fromkeys(names))


def resolve(names: Sequence[str], obj: Objective, explicit: bool) -> tuple[list[Method], dict[str, str]]:
    """The methods to run, and those left out with the reason: every name must apply when the user named it
    (explicit), else those that apply run and the others are left out."""
    chosen, skipped = [], {}
    for name in names:
        reason = METHODS[name].supports(obj)
        if reason is not None and explicit:
            raise AttnscopeError(reason, parameter="methods")
        if reason is None:
            chosen.append(METHODS[name])
        else:
            skipped[name] = reason
    return chosen, skipped
