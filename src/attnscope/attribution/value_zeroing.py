"""Value zeroing (Mohebbi, Zuidema, Chrupała & Alishahi 2023, "Quantifying Context Mixing in Transformers",
EACL), as a LayerMixing.

For layer l and source position j, the value vector of j is zeroed in every head of layer l only, and layer
l's output representation of each position i is compared with the untouched one:

    score_lij = 1 - cos(x~_i^l, x_i^l)            # cosine distance; rows normalised over j (documented)

(x^l: the output of the whole layer l, attention block and feed-forward; rows divided by their sum, as the
paper does before rolling layers out). Layers before l are untouched, so layer l reads its real input.

How it runs, no model code copied:
- one untouched forward pass through capture's registered attention function with a ValueZeroing that zeroes
  nothing; a pre-hook on each layer module keeps what the layer was called with (its input hidden states and
  the model's own keyword arguments: mask, rotation tables), and capture keeps each layer's alpha and v;
- per layer l, the real layer module is called again on that input, widened to 1 + n rows (row 0 untouched,
  row r zeroing token r - 1), inside capture.intervening: the family's own eager attention computes the
  context sum_k alpha_ik v_k and the intervention removes j's term, context_i - alpha_ij v_j =
  sum_(k != j) alpha_ik v_k (alpha and v of the untouched pass: the layer's input is the same, so they are;
  the subtraction is exact up to float rounding, about 1e-7 of the context). Both sides of each distance come
  from the same call (row 0 and row r).

The check: with nothing zeroed, the intervened forward's layer outputs equal the untouched model's forward
bit for bit (max error 0, bound 0), and every layer call made exactly one attention call through the
registered function (else nothing was zeroed: the check fails). Cost: 2 forward passes plus, per layer,
ceil(n / rows per call) calls of that layer alone, 1 + n rows in all (one untouched row per call); counted
in forward passes of the text (the rows of all layer calls over the number of layers), LayerMixing.forwards
is n + 3 where each layer takes one call; no backward. Every family with an attnscope adapter whose layers
are separate modules (not ALBERT), encoder-decoders excepted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import Cache

from attnscope.attribution.blocks import one_text, refuse_unsupported
from attnscope.attribution.mixing import LayerMixing, normalise_rows
from attnscope.capture import LayerCapture, capturing, intervening
from attnscope.families import attention_modules, submodule
from attnscope.maths import expand_kv
from attnscope.models import Model

MAX_BATCH_TOKENS = 4096  # rows x tokens per zeroed forward
Row = tuple[int, int]  # (layer, token) zeroed in that batch row; (-1, -1): untouched


@dataclass
class ValueZeroing:
    """A capture.Intervention: in batch row r, remove the term of token rows[r][1] from the context of layer
    rows[r][0]. weights [layer][head, query, key] and v [layer][head, key, d_head] from an untouched pass;
    first: the layer of the first attention call it sees (a single layer called alone)."""

    rows: list[Row]
    weights: list[torch.Tensor]
    v: list[torch.Tensor]
    first: int = 0
    calls: int = field(default=0)

    def edit_mask(self, mask: torch.Tensor | None, query: torch.Tensor,
                  module: nn.Module | None = None) -> torch.Tensor | None:
        return mask

    def edit_context(self, context: torch.Tensor) -> torch.Tensor:
        """context: [batch, query, head, d_head], as the family's eager attention returns it."""
        layer = (self.first + self.calls) % max(1, len(self.weights))
        self.calls += 1
        hit = [(r, j) for r, (lay, j) in enumerate(self.rows) if lay == layer]
        if not hit:
            return context
        rows, tokens = [r for r, _ in hit], [j for _, j in hit]
        a = self.weights[layer][:, :, tokens]  # [head, query, row]
        vj = self.v[layer][:, tokens, :]  # [head, row, d_head]
        term = torch.einsum("hqr,hrd->rqhd", a, vj).to(context.dtype)  # [row, query, head, d_head]
        out = context.clone()
        out[rows] = context[rows] - term
        return out


@dataclass
class LayerCall:
    """What one layer module was called with in the untouched pass: hidden states first, then the rest."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def widened(self, rows: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The same call over `rows` copies of the hidden states [1, token, d_model] (the rest broadcasts), with
        no key/value cache: the pass's cache already holds this layer's keys, and this call adds none."""
        kwargs = {k: None if isinstance(v, Cache) else v for k, v in self.kwargs.items()}
        if self.args:
            rest = (None if isinstance(a, Cache) else a for a in self.args[1:])
            return (self.args[0].expand(rows, -1, -1), *rest), kwargs
        return self.args, {**kwargs, "hidden_states": self.kwargs["hidden_states"].expand(rows, -1, -1)}


def value_zeroing(m: Model, inputs: dict[str, torch.Tensor], max_batch_tokens: int = MAX_BATCH_TOKENS) -> LayerMixing:
    """Value zeroing per layer for one text (inputs: a tokenizer's tensors, batch of one)."""
    refuse_unsupported(m, "value_zeroing", whole_block=False)
    n = one_text(inputs, "value_zeroing")
    plain = layer_outputs(m, inputs)
    errors, cap, layer_calls = unchanged_error(m, inputs, plain, ValueZeroing([(-1, -1)], [], []))
    weights = [c.weights[0] for c in cap.calls]  # [head, query, key]
    v = [expand_kv(c.v[0], c.weights.shape[1] // c.v.shape[1]) for c in cap.calls]  # [head, key, d_head]
    per_call = max(1, max_batch_tokens // n - 1)
    scores = np.zeros((len(plain), n, n))  # [layer, query i, zeroed token j]
    calls_ok, layer_runs, rows_run = True, 0, 0
    for layer, module in enumerate(layer_modules_of(m.model)):
        for start in range(0, n, per_call):
            rows: list[Row] = [(-1, -1), *((layer, j) for j in range(start, min(n, start + per_call)))]
            edit = ValueZeroing(rows, weights, v, first=layer)
            out = zeroed_output(m, module, layer_calls[layer], edit)  # [row, token, d_model]
            calls_ok &= edit.calls == 1  # the layer's one attention call went through the registry
            layer_runs, rows_run = layer_runs + 1, rows_run + len(rows)
            for r, (_, j) in enumerate(rows[1:], start=1):
                scores[layer, :, j] = cosine_distance(out[0], out[r])
    return _mixing(scores, errors, calls_ok, 2 + -(-rows_run // len(plain)), layer_runs)  # layer calls as forwards


def _mixing(scores: np.ndarray, errors: np.ndarray, calls_ok: bool, forwards: int, layer_runs: int) -> LayerMixing:
    if not calls_ok:
        errors = np.full_like(errors, np.nan)
    verified = bool(calls_ok and (errors == 0.0).all())
    detail = ("with nothing zeroed, the intervened forward's layer outputs equal the model's forward bit for bit "
              f"(max error {float(np.nanmax(errors)) if calls_ok else float('nan'):.1e}); {layer_runs} zeroing "
              "calls of single layers, each through the registered attention function: "
              f"{'yes' if calls_ok else 'NO, nothing was zeroed'}")
    return LayerMixing("value_zeroing", normalise_rows(scores), errors, 0.0, verified, detail, forwards)


def cosine_distance(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    """1 - cos(a_i, b_i) per position, in float64, as ||a_i/|a_i| - b_i/|b_i| ||^2 / 2 (the same number, never
    below 0 and exact near 0 where 1 - cos would cancel): [token, d_model] x2 -> [token]."""
    a64, b64 = a.double(), b.double()
    unit_a, unit_b = a64 / a64.norm(dim=-1, keepdim=True), b64 / b64.norm(dim=-1, keepdim=True)
    return np.asarray((0.5 * (unit_a - unit_b).pow(2).sum(-1)).cpu().numpy(), dtype=np.float64)


@torch.no_grad()
def layer_outputs(m: Model, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The untouched model's layer outputs [batch, token, d_model], one per layer."""
    with _layer_hooks(m, []) as outs:
        m.model(**inputs)
    return outs


@torch.no_grad()
def unchanged_error(m: Model, inputs: dict[str, torch.Tensor], plain: list[torch.Tensor],
                    edit: ValueZeroing) -> tuple[np.ndarray, LayerCapture, list[LayerCall]]:
    """Per layer, max |output through the intervention - the model's own output| (0 = bit for bit) for an edit
    that zeroes nothing; the pass's capture (alpha and v of every layer) and what each layer was called with."""
    calls: list[LayerCall] = []
    with intervening(m.model, edit), capturing(m.model) as cap, _layer_hooks(m, calls) as outs:
        m.model(**inputs)
    errors = [float((a - b).abs().max()) for a, b in zip(plain, outs, strict=True)]
    return np.asarray(errors, dtype=np.float64), cap, calls


@torch.no_grad()
def zeroed_output(m: Model, module: nn.Module, call: LayerCall, edit: ValueZeroing) -> torch.Tensor:
    """One layer module called alone on its untouched input widened to len(edit.rows) rows, inside the
    intervention: its output [row, token, d_model]."""
    args, kwargs = call.widened(len(edit.rows))
    with intervening(m.model, edit):
        out = module(*args, **kwargs)
    return _hidden(out)


def _hidden(out: Any) -> torch.Tensor:
    """A layer's hidden states, whether it returns them alone or first in a tuple."""
    hidden = out[0] if isinstance(out, tuple) else out
    assert isinstance(hidden, torch.Tensor)
    return hidden.detach()


@contextlib.contextmanager
def _layer_hooks(m: Model, calls: list[LayerCall]) -> Iterator[list[torch.Tensor]]:
    """Each layer module's output (the whole layer: attention block and feed-forward), and into calls what
    it was called with."""
    outs: list[torch.Tensor] = []

    def before(_mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        calls.append(LayerCall(args, dict(kwargs)))

    def after(_mod: nn.Module, _args: Any, out: Any) -> None:
        outs.append(_hidden(out))

    handles = []
    for layer in layer_modules_of(m.model):
        handles += [layer.register_forward_pre_hook(before, with_kwargs=True), layer.register_forward_hook(after)]
    try:
        yield outs
    finally:
        for h in handles:
            h.remove()


def layer_modules_of(model: nn.Module) -> list[nn.Module]:
    """The layer holding each attention module: its path up to the layer index ("model.layers.3")."""
    names = {id(mod): name for name, mod in model.named_modules()}
    layers = []
    for mod in attention_modules(model):
        parts = names[id(mod)].split(".")
        index = next(i for i, p in enumerate(parts) if p.isdigit())
        layers.append(submodule(model, ".".join(parts[:index + 1])))
    return layers


__all__ = ["LayerCall", "ValueZeroing", "cosine_distance", "layer_modules_of", "layer_outputs", "unchanged_error",
           "value_zeroing", "zeroed_output"]
