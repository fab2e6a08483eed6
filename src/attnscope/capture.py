"""Capture attention inside the real forward pass, through transformers' own extension points.

An attention function registered in `AttentionInterface` under the name "attnscope"
runs the model family's own `eager_attention_forward` and hands q, k, v, the mask,
the weights and the context to the active recorder. Module hooks take the attention
input `x` and the output projection's result `output`. No model code is copied.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from attnscope.families import attention_modules, eager_attention, family_of

ATTENTION_NAME = "attnscope"


class Recorder(Protocol):
    """Receives each attention call of a forward pass, in layer order."""

    def on_attention(self, call: AttentionCall) -> None: ...


@dataclass(frozen=True)
class AttentionCall:
    """What one layer's attention function saw and produced (batched, padded)."""

    module: nn.Module
    q: torch.Tensor  # [batch, head, query, d_head] (after the rotation, for RoPE families)
    k: torch.Tensor  # [batch, kv_head, key, d_head]: one per k/v head (grouped-query attention), not repeated
    v: torch.Tensor  # [batch, kv_head, key, d_head]
    mask: torch.Tensor | None  # additive, [batch, 1, query, key]
    scaling: float
    weights: torch.Tensor  # [batch, head, query, key]
    context: torch.Tensor  # [batch, head, query, d_head]


_ACTIVE: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("attnscope_recorder", default=None)


# --- interventions (attnscope.interventions): edit a layer's mask and context inside the real forward pass ---
class Intervention(Protocol):
    """Edits each attention call of a forward pass, in layer order: the mask before the attention, the
    context after it. Each call makes edit_mask (told the attention module, so an encoder-decoder's edit knows
    the kind of call) then edit_context."""

    def edit_mask(self, mask: torch.Tensor | None, query: torch.Tensor,
                  module: nn.Module | None = None) -> torch.Tensor | None: ...

    def edit_context(self, context: torch.Tensor) -> torch.Tensor: ...  # [batch, query, head, d_head]


_INTERVENTION: contextvars.ContextVar[Intervention | None] = contextvars.ContextVar(
    "attnscope_intervention", default=None)


@contextlib.contextmanager
def intervening(model: PreTrainedModel, intervention: Intervention) -> Iterator[None]:
    """Let the intervention edit every attention call of forward passes inside the block."""
    token = _INTERVENTION.set(intervention)
    try:
        with attention_implementation(model):
            yield
    finally:
        _INTERVENTION.reset(token)
# --- end of interventions ---


def attention_function(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Registered as "attnscope": the family's eager attention, observed (and edited by an active Intervention)."""
    intervention = _INTERVENTION.get()
    if intervention is not None:
        attention_mask = intervention.edit_mask(attention_mask, query, module)
    context, weights = eager_attention(module)(
        module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
    )
    if intervention is not None:
        context = intervention.edit_context(context)
    recorder = _ACTIVE.get()
    if recorder is not None:
        s = float(scaling) if scaling is not None else float(query.shape[-1]) ** -0.5
        # eager returns context as [batch, query, head, d_head]; name it [batch, head, query, d_head]
        call = AttentionCall(module, query, key, value, attention_mask, s, weights, context.transpose(1, 2))
        recorder.on_attention(call)
    return context, weights


AttentionInterface.register(ATTENTION_NAME, attention_function)
AttentionMaskInterface.register(ATTENTION_NAME, eager_mask)


@dataclass
class LayerCapture:
    """Everything captured in one forward pass, one list entry per layer (batched, padded)."""

    calls: list[AttentionCall] = field(default_factory=list)
    x: list[torch.Tensor] = field(default_factory=list)  # [batch, token, d_model]
    output: list[torch.Tensor] = field(default_factory=list)  # [batch, token, d_model]

    def on_attention(self, call: AttentionCall) -> None:
        self.calls.append(call)


@contextlib.contextmanager
def attention_implementation(model: PreTrainedModel, name: str = ATTENTION_NAME) -> Iterator[None]:
    """Route the model's attention through a registered function, then restore it."""
    before = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


@contextlib.contextmanager
def recording(model: PreTrainedModel, recorder: Recorder) -> Iterator[None]:
    """Send every attention call of forward passes inside the block to the recorder."""
    token = _ACTIVE.set(recorder)
    try:
        with attention_implementation(model):
            yield
    finally:
        _ACTIVE.reset(token)


@contextlib.contextmanager
def capturing(model: PreTrainedModel) -> Iterator[LayerCapture]:
    """Capture q, k, v, weights and context per layer, plus x and output where the family is known."""
    cap = LayerCapture()
    with hooked(model, cap, cap.x.append, cap.output.append):
        yield cap


@contextlib.contextmanager
def hooked(model: PreTrainedModel, recorder: Recorder, on_x: Callable[[torch.Tensor], None],
           on_output: Callable[[torch.Tensor], None], modules: list[nn.Module] | None = None) -> Iterator[None]:
    """Attention calls go to the recorder; each layer's attention input x [batch, token, d_model] to on_x and,
    where the family is known, its output projection's result [batch, token, d_model] to on_output (detached).
    modules: the model's attention modules, each once, where the caller has found them (else searched here)."""
    handles = []
    fam = family_of(model)
    for mod in attention_modules(model) if modules is None else modules:
        handles.append(mod.register_forward_pre_hook(_x_hook(on_x), with_kwargs=True))
        if fam is not None:
            proj = fam.out_proj(model, mod)
            handles.append(proj.register_forward_hook(lambda _m, _i, out: on_output(out.detach())))
    try:
        with recording(model, recorder):
            yield
    finally:
        for h in handles:
            h.remove()


def _x_hook(on_x: Callable[[torch.Tensor], None]) -> Callable[..., None]:
    def hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = args[0] if args else kwargs["hidden_states"]
        on_x(x.detach())

    return hook


__all__ = ["ATTENTION_NAME", "AttentionCall", "LayerCapture", "Recorder", "attention_function",
           "attention_implementation", "attention_modules", "capturing", "hooked", "recording"]
