"""A long trace streamed: each layer recomputed, checked and handed on inside the forward pass, its weights let go.

`forward_pass` keeps every layer's stages until the forward pass ends, and its check then reads them all again:
for SmolLM2 at 2,048 tokens that is 4.5 GB of float32 weights, in pages the forward pass has to be handed fresh,
which cost about a sixth of the forward pass itself (docs/serve.md). The web app's long traces need the weights
only as uint8 maps. Here each layer, once its attention module has returned, is

1. checked: recomputed from its captured input x and its own weights and compared, stage by stage, with what the
   capture saw and with the weights the module itself returned (verify.check.LayerCheck, the same computation and
   comparisons as forward_pass(...).finish(), chunk for chunk);
2. handed to `on_weights(layer, weights [head, query, key])`, which keeps what it needs (the web app: uint8 codes,
   attnscope.serve.maps.Compactor);
3. let go of: its x, context and output are copied into [layer, ...] arrays (what the web app keeps of a long
   trace to answer the Neuron tab and a cell's explanation, attnscope.serve.rows; 9% of the weights' bytes at 2,048
   tokens on SmolLM2), and nothing else of the layer is held.

After the forward pass, x is compared with what the model's hidden states imply, as forward_pass's check does. The
result is a Trace holding x, context and output, with the check of every stage. One text, on a family attnscope
recomputes (`can_stream`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from attnscope import families
from attnscope.capture import LayerCapture, attention_modules, hooked
from attnscope.maths import AttentionParams
from attnscope.models import Model
from attnscope.placement import on_host
from attnscope.records.trace import Trace
from attnscope.tracing.one_pass import model_info, model_outputs, per_layer, prepare, require_calls
from attnscope.verify.check import ErrorTable, LayerCheck, compare_with_model
from attnscope.verify.recompute import layer_params

WeightsSink = Callable[[int, torch.Tensor], None]  # (layer, weights [head, query, key] float32 on the host)


@dataclass(frozen=True)
class Streamed:
    """A streamed trace: the Trace (arrays x, context and output of the text [layer, ...], float32, contiguous; the
    check of every stage) and the layered stages a full trace of the same text holds, in its order."""

    trace: Trace
    stages: tuple[str, ...]


def can_stream(m: Model) -> bool:
    """Whether attnscope recomputes this model's attention (and so can check it layer by layer)."""
    return not families.is_encoder_decoder(m.model) and families.why_unsupported(m.model) is None and \
        families.family_of(m.model) is not None


class _Streamer(LayerCapture):
    """The capture of forward_pass, which checks each layer as it ends, hands its weights on, copies x, context and
    output into [layer, ...] arrays and lets go of the rest (its calls keep empty stand-ins of the shapes only)."""

    def __init__(self, params: list[AttentionParams], keep: torch.Tensor, on_weights: WeightsSink) -> None:
        super().__init__()
        self.table = ErrorTable(keep, len(params), params[0].n_heads)
        self.check = LayerCheck(self.table, params, keep)
        self.on_weights = on_weights
        self.own: list[torch.Tensor | None] = []  # per layer: the weights the attention module returned
        self.kept: dict[str, np.ndarray] = {}  # KEPT stage -> [layer, ...] float32 of the text, made at layer 0
        self.done = 0  # layers checked and handed on

    def on_output(self, output: torch.Tensor) -> None:
        """The output projection's result [batch, token, d_model]."""
        self.output.append(output)
        self._advance()

    def on_module(self, _module: nn.Module, _args: Any, out: Any) -> None:
        """An attention module has returned: its attention output and, second, its weights (what
        output_attentions collects). Before its output projection (BERT) or after it (Llama)."""
        own = out[1] if isinstance(out, tuple) and len(out) > 1 else None
        self.own.append(own if isinstance(own, torch.Tensor) else None)
        self._advance()

    def _advance(self) -> None:
        """Check and hand on the next layer once its x, attention call, output and module's answer are all in."""
        layer = self.done
        if min(len(self.x), len(self.calls), len(self.output), len(self.own)) <= layer:
            return
        call = self.calls[layer]
        captured = on_host({"q": call.q, "k": call.k, "v": call.v, "weights": call.weights, "context": call.context,
                            "x": self.x[layer], "output": self.output[layer]})  # [batch, ...] each
        own = self.own[layer]
        self.check.verify(layer, captured, {} if own is None else {"weights": on_host(own)})
        self.on_weights(layer, captured["weights"][0])  # [head, query, key]
        for stage in KEPT:
            if stage not in self.kept:
                self.kept[stage] = np.empty((len(self.check.params), *captured[stage].shape[1:]), dtype=np.float32)
            self.kept[stage][layer] = captured[stage][0].numpy()  # context: its [head, token, d_head] laid out
        self.calls[layer] = dataclasses.replace(call, q=_shape_of(call.q), k=_shape_of(call.k), v=_shape_of(call.v),
                                                weights=_shape_of(call.weights), context=_shape_of(call.context))
        self.x[layer], self.output[layer], self.own[layer] = _shape_of(self.x[layer]), _LET_GO_TENSOR, None
        self.done += 1


# what the web app keeps of a long trace (attnscope.serve.rows.KEPT): what explain's x, merged and output steps read
KEPT = ("x", "context", "output")
_LET_GO_TENSOR = torch.empty(0)


def _shape_of(t: torch.Tensor) -> torch.Tensor:
    """An empty tensor with t's sizes but none along the tokens (what a trace's description reads: d_head, kv_heads,
    d_model), holding no memory."""
    return t.new_empty((*t.shape[:-2], 0, t.shape[-1])) if t.dim() >= 2 else t.new_empty(0)


@torch.no_grad()
def streamed_trace(text: str, text_pair: str | None, m: Model, max_length: int | None, truncate: bool,
                   on_weights: WeightsSink) -> Streamed:
    """Trace one text as forward_pass(...).finish() does, each layer checked and its weights handed to on_weights
    inside the forward pass (module doc). The model must be one `can_stream` accepts."""
    m, _texts, _pairs, enc = prepare(text, text_pair, m, max_length, truncate)
    n = int(enc.inputs["input_ids"].shape[1])
    params = on_host(layer_params(m.model, n))
    if params is None or not can_stream(m):
        raise ValueError(f"{m.name} cannot be traced layer by layer: see can_stream")
    keep = enc.inputs["attention_mask"]
    streamer = _Streamer(params, keep, on_weights)
    modules = attention_modules(m.model)
    ends = [mod.register_forward_hook(streamer.on_module) for mod in modules]
    try:
        with hooked(m.model, streamer, streamer.x.append, streamer.on_output, modules):
            inputs = {k: v.to(m.device) for k, v in enc.inputs.items()}
            out = m.base(**inputs, output_attentions=False, output_hidden_states=True)  # the weights: streamed
    finally:
        for h in ends:
            h.remove()
    require_calls(m, streamer)
    if streamer.done != len(params):
        raise RuntimeError(f"{m.name}: {streamer.done} of {len(params)} layers were checked inside the forward pass")
    kept = streamer.kept  # [layer, ...] each
    for layer, x in enumerate(on_host(model_outputs(m, out, len(streamer.calls))).get("x", [])):
        compare_with_model(streamer.table, layer, {"x": torch.from_numpy(kept["x"][layer])[None]}, {"x": x})
    trace = Trace(model=model_info(m, streamer, params), text=text, pair=text_pair, tokens=enc.tokens[0],
                  arrays=dict(kept), scaling=[c.scaling for c in streamer.calls], truncated=enc.truncated[0],
                  comparisons=streamer.table.comparisons(0), output_projection=[p.w_o.numpy() for p in params])
    # forward_pass's layered stages in its order (the calls and lists hold their shapes), then scores as its
    # records add them (tracing.rows.row_arrays: q k^T of its q and k)
    return Streamed(trace, (*per_layer(streamer), "scores"))


__all__ = ["Streamed", "WeightsSink", "can_stream", "streamed_trace"]
