"""Head gates and edge knockouts, applied inside the real forward pass through capture's registered
attention function (capture.intervening); no model code is copied or patched.

A gate g scales one head's context in one batch row: context' = g * context + (1 - g) * source,
where source is what a closed gate lets in (zeros by default; a mean over a reference set, or
another run's context for patching). At g = 1 the context passes unchanged (x * 1 is exact), so
the model's outputs are bit for bit those of the untouched model. A knockout adds -inf to the
additive mask at chosen (query, key) edges before the softmax.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from attnscope.capture import LayerCapture, capturing, intervening
from attnscope.errors import AttnscopeError, validate_index
from attnscope.models import Model
from attnscope.numbers import is_count

Head = tuple[int, int]  # (layer, head), both 0-indexed


@dataclass
class HeadEdit:
    """What to change in each layer of one forward pass over a batch (a capture.Intervention).

    scale: [layer, batch, head] gates (None: no gate); source: per layer the context a closed gate lets in,
    [batch|1, head, query|1, d_head] (None: zeros); knock: per layer an additive [batch|1, 1, query, key]
    mask, -inf on blocked edges and 0 elsewhere (None: no knockout in that layer).
    """

    n_layers: int
    scale: torch.Tensor | None = None
    source: list[torch.Tensor | None] | None = None
    knock: list[torch.Tensor | None] | None = None
    _calls: int = field(default=0, repr=False)

    @property
    def layer(self) -> int:
        return self._calls % self.n_layers

    def edit_mask(self, mask: torch.Tensor | None, query: torch.Tensor,
                  module: object = None) -> torch.Tensor | None:
        knock = self.knock[self.layer] if self.knock is not None else None
        if knock is None:
            return mask
        knock = knock.to(device=query.device, dtype=query.dtype if mask is None else mask.dtype)
        return knock if mask is None else mask + knock  # [batch, 1, query, key]

    def edit_context(self, context: torch.Tensor) -> torch.Tensor:
        """context: [batch, query, head, d_head], as the family's eager attention returns it."""
        layer = self.layer
        self._calls += 1
        if self.scale is None:
            return context
        # in the context's device and dtype (1 is exact in every float type), so outputs keep theirs
        g = self.scale[layer][:, None, :, None].to(device=context.device, dtype=context.dtype)  # [batch, 1, head, 1]
        out = context * g
        source = self.source[layer] if self.source is not None else None
        if source is not None:
            source = source.to(device=context.device, dtype=context.dtype)
            out = out + source.transpose(1, 2) * (1 - g)  # source as [batch|1, query|1, head, d_head]
        return out


def n_layers_heads(m: Model) -> tuple[int, int]:
    """How many attention calls one forward makes (ALBERT shares one module across them) and heads per layer."""
    return m.n_layers, m.n_heads


def ones(m: Model, batch: int) -> torch.Tensor:
    """All gates open: [layer, batch, head]."""
    n_layers, n_heads = n_layers_heads(m)
    return torch.ones(n_layers, batch, n_heads)


def validate_heads(m: Model, heads: Sequence[Head]) -> list[Head]:
    """The (layer, head) pairs, each checked against the model's range; at least one."""
    if not heads:
        raise AttnscopeError("no heads given: name at least one head as (layer, head), 0-indexed")
    n_layers, n_heads = n_layers_heads(m)
    for layer, head in heads:
        validate_index("layer", layer, n_layers, m.name)
        validate_index("head", head, n_heads, m.name)
    return [(int(layer), int(head)) for layer, head in heads]


def parse_heads(spec: str, what: str = "heads") -> list[Head]:
    """"3.1,0.7" -> [(3, 1), (0, 7)]: layer.head pairs, 0-indexed."""
    heads = []
    for item in (s.strip() for s in spec.split(",")):
        parts = item.split(".")
        if len(parts) != 2 or not all(is_count(p) for p in parts):
            raise AttnscopeError(f"{what} {item!r} is not layer.head: write heads like 3.1,0.7 (0-indexed)")
        heads.append((int(parts[0]), int(parts[1])))
    return heads


def run(m: Model, inputs: dict[str, torch.Tensor], edit: HeadEdit | None, **kwargs: object) -> Any:
    """One forward pass of the model with the edit applied (None: the untouched model)."""
    if edit is None:
        return m.model(**inputs, **kwargs)
    edit._calls = 0
    with intervening(m.model, edit):
        return m.model(**inputs, **kwargs)


@contextlib.contextmanager
def edited_capture(m: Model, edit: HeadEdit) -> Iterator[LayerCapture]:
    """Capture (q, k, v, weights, the edited context, x, output) of forward passes run with the edit."""
    edit._calls = 0
    with intervening(m.model, edit), capturing(m.model) as cap:
        yield cap


def contexts(m: Model, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Each layer's per-head context of an untouched forward: [batch, head, query, d_head] per layer."""
    with torch.no_grad(), capturing(m.model) as cap:
        m.model(**inputs)
    return [c.context.detach() for c in cap.calls]


def mean_contexts(m: Model, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor | None]:
    """Each layer's context averaged over the real tokens of a reference batch: [1, head, 1, d_head]."""
    keep = inputs["attention_mask"].to(torch.float32)[:, None, :, None]  # [batch, 1, query, 1]
    out: list[torch.Tensor | None] = []
    for ctx in contexts(m, inputs):  # [batch, head, query, d_head]
        total = (ctx * keep).sum(dim=(0, 2), keepdim=True)  # [1, head, 1, d_head]
        out.append(total / keep.sum())
    return out
