"""One layer of a long trace, recomputed from its attention input: the Neuron tab and a cell's explanation
without the whole exact trace.

A long trace's exact arrays do not stay in the trace cache (SmolLM2 at 2,048 tokens: 4.5 GB of weights and
as much of scores), so /api/neuron and /api/explain once traced the whole text again (82 s and 107 s there).
Instead the map store keeps, beside the maps' uint8 codes, each layer's captured attention input x
[layer, token, d_model] (SmolLM2 at 2,048 tokens: 141 MB) and the trace's description and check; a request
for (layer, head) recomputes that layer from x and the layer's own weights with the check's maths
(maths.multi_head_attention, as verify.recompute runs it). That is the computation the check compared with
the capture and found equal: on MiniLM at 512 tokens and SmolLM2 at 300 its q, k, v, scores, weights, context
and output equal the captured arrays bit for bit (tests/serve/test_serve_rows.py compares the answers).
The Neuron tab (one_head) needs one head only: q, k and v are projected for every head (one product each, as the
check does) and that head's [query, key] work is done alone. The alternative, a forward pass up to the layer,
costs up to a whole forward pass (tens of seconds at 2,048 tokens); one layer's recompute ~1.5 s there, one
head's ~0.2-0.9 s (2 cores, loaded).
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from attnscope import maths
from attnscope.errors import validate_index
from attnscope.models import Model
from attnscope.records.trace import Trace
from attnscope.serve import binary
from attnscope.stages import ARRAY_AXES
from attnscope.tracing import streamed
from attnscope.verify.recompute import layer_mask, layer_params
from attnscope.views.payload import neuron_arrays, neuron_fields

# captured, [layer, ...]: context and output are what explain's last steps read (a streamed trace keeps the same)
KEPT = streamed.KEPT


@dataclass(frozen=True)
class Rows:
    """A long trace's skeleton (tokens, description, check) with KEPT arrays only, and the layered stages it had."""

    trace: Trace  # arrays: x, context, output as captured, float32
    stages: tuple[str, ...]  # e.g. q, k, v, weights, context, x, output, scores

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.trace.arrays.values())


def keep(trace: Trace, stages: tuple[str, ...] | None = None) -> Rows | None:
    """What a head's recompute needs: the trace without its arrays but x [layer, token, d_model], and context
    [layer, head, token, d_head] and output [layer, token, d_model] for the explanation's merged and output steps
    (copies, so the batch they were captured in can go). None when the trace has no recompute (no x, an
    unsupported family). stages: the layered stages the trace had, where its arrays no longer say (a streamed
    trace's weights, attnscope.tracing.streamed); by default, its arrays'."""
    if "x" not in trace.arrays or trace.unsupported is not None or not trace.comparisons:
        return None
    if stages is None:
        stages = tuple(s for s in trace.arrays if ARRAY_AXES.get(s, ("",))[0] == "layer")
    kept = {s: np.ascontiguousarray(trace.arrays[s], dtype=np.float32) for s in KEPT if s in trace.arrays}
    return Rows(dataclasses.replace(trace, arrays=kept, output_projection=None), stages)


def x_bytes(model: Model, tokens: int) -> int:
    """The bytes keep() holds for a trace of this many tokens: float32 x and output [layer, token, d_model] and
    context [layer, head, token, d_head]."""
    weight = model.model.get_input_embeddings().weight  # [vocab, d_model]
    assert isinstance(weight, torch.Tensor)
    params = layer_params(model.model, 1)
    heads_width = int(params[0].w_q.shape[1]) if params else int(weight.shape[-1])  # head * d_head
    return 4 * model.n_layers * tokens * (2 * int(weight.shape[-1]) + heads_width)


@torch.no_grad()
def one_layer(rows: Rows, model: Model, layer: int) -> Trace | None:
    """The trace with its stages of `layer` recomputed; every layer index of its arrays reads that one layer (a
    stride-0 view, no copies: only `layer` may be asked). None when the family's recompute lacks a stage."""
    kept, stages = rows.trace, rows.stages
    validate_index("layer", layer, int(kept.arrays["x"].shape[0]))  # the full trace's words
    x = kept.arrays["x"]  # [layer, token, d_model]
    params = layer_params(model.model, x.shape[1])
    if params is None or len(params) != x.shape[0]:
        return None
    p = params[layer]
    mask = layer_mask(x.shape[1], p.window, None)  # one text, no padding: as the trace's check
    st = maths.multi_head_attention(torch.from_numpy(x[layer])[None], p, mask, keep=stages)  # [1, ...] each
    if any(s not in st for s in stages):
        return None
    arrays = {s: _every_layer(st[s][0].numpy(), x.shape[0]) for s in stages if s not in kept.arrays}
    return dataclasses.replace(kept, arrays={**kept.arrays, **arrays})


@torch.no_grad()
def one_head(rows: Rows, model: Model, layer: int, head: int) -> Trace | None:
    """The trace with q, k, v, scores and weights of one head of `layer`, and the kept context and output (what
    the Neuron tab and the explanation read): q, k and v of every head projected as the check does, then the
    [query, key] work of that head alone (a ninth of the layer's on SmolLM2). Every layer and head index of the
    recomputed arrays reads that head (stride 0), so only (layer, head) may be asked. None when the family's
    recompute cannot take one head alone (T5's relative bias) or lacks a stage."""
    validate_index("layer", layer, int(rows.trace.arrays["x"].shape[0]))
    x = rows.trace.arrays["x"]  # [layer, token, d_model]
    params = layer_params(model.model, x.shape[1])
    if params is None or len(params) != x.shape[0] or params[layer].relative_bias is not None:
        return None
    p = params[layer]
    validate_index("head", head, p.n_heads)
    d, kv = p.d_head, head // p.groups
    projected = maths.project_qkv(torch.from_numpy(x[layer])[None], p)  # [1, head|kv_head, token, d_head]
    one = {"q": projected["q"][:, head:head + 1], "k": projected["k"][:, kv:kv + 1], "v": projected["v"][:, kv:kv + 1]}
    # the head alone: its d_head columns of W_Q (so d_head reads right) and of W_O (the output is not kept)
    p1 = dataclasses.replace(p, w_q=p.w_q[:, head * d:(head + 1) * d], w_o=p.w_o[head * d:(head + 1) * d], b_o=None,
                             n_heads=1, n_kv_heads=1, sinks=None if p.sinks is None else p.sinks[head:head + 1])
    mask = layer_mask(x.shape[1], p.window, None)
    st = maths.multi_head_attention(torch.from_numpy(x[layer])[None], p1, mask, keep=("scores", "weights", "context"),
                                    projected=one)  # [1, 1, ...] each
    formed = {**one, **st}
    if any(s not in formed and s not in rows.trace.arrays for s in rows.stages if s != "output"):
        return None
    arrays = {s: _every_head(a[0, 0].numpy(), x.shape[0], p.kv_heads if s in ("k", "v") else p.n_heads)
              for s, a in formed.items() if s not in rows.trace.arrays}  # the kept context is every head's
    return dataclasses.replace(rows.trace, arrays={**rows.trace.arrays, **arrays})


class RecentHeads:
    """The last few heads one_head recomputed, by (trace id, layer, head): the Neuron tab's head, then a matrix
    cell of it clicked (its explanation), or another query shown, reuse it (SmolLM2 at 2,048 tokens: 0.15-0.9 s
    each). Each keeps only its own arrays (~40 MB there) and a weak reference to the Rows they came from: a trace
    the map store let go is not kept alive here, and a retraced one is recomputed. Shared by the pool's threads."""

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._kept: OrderedDict[tuple[str, int, int], tuple[weakref.ref[Rows], dict[str, np.ndarray]]] = OrderedDict()
        self._lock = threading.Lock()

    def one_head(self, trace_id: str, rows: Rows, model: Model, layer: int, head: int) -> Trace | None:
        """rows' trace with (layer, head) recomputed, as one_head(rows, model, layer, head), made once. Two requests
        for a new head both make it (rare; no lock is held while a head is recomputed)."""
        key = (trace_id, layer, head)
        with self._lock:
            found = self._kept.get(key)
            if found is not None and found[0]() is rows:
                self._kept.move_to_end(key)
                return dataclasses.replace(rows.trace, arrays={**rows.trace.arrays, **found[1]})
        made = one_head(rows, model, layer, head)
        if made is None:
            return None
        own = {s: a for s, a in made.arrays.items() if s not in rows.trace.arrays}
        with self._lock:
            self._kept[key] = (weakref.ref(rows), own)
            self._kept.move_to_end(key)
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
        return made


def _every_head(one: np.ndarray, layers: int, heads: int) -> np.ndarray:
    """[...] -> [layer, head, ...] where each layer and head is `one` (stride 0 on both axes)."""
    return np.lib.stride_tricks.as_strided(one, (layers, heads, *one.shape), (0, 0, *one.strides))


def _every_layer(one: np.ndarray, layers: int) -> np.ndarray:
    """[...] -> [layer, ...] where each layer is `one` (stride 0 on the layer axis; left writable, as the trace's
    own arrays, so torch.from_numpy of a slice does not warn: nothing writes into an answer's arrays)."""
    return np.lib.stride_tricks.as_strided(one, (layers, *one.shape), (0, *one.strides))


def neuron_binary(trace: Trace, layer: int, head: int, query: int | None = None) -> bytes:
    """views.neuron_block's numbers in the binary form (attnscope.serve.binary): its fields (layer, head, scaling,
    d_head, kv_head, stages, and query when asked) as the header, each stage's float32 [token, d_head] or
    [query, key] as an array of its own. At 2,048 SmolLM2 tokens 34 MB of raw float32; with a query (the row the
    neuron view shows) q, context, scores and weights are that row [1, ...] and the answer 1.1 MB."""
    arrays = neuron_arrays(trace, layer, head, query)
    return binary.encode(neuron_fields(trace, layer, head, arrays, query),
                         {s: (a, ARRAY_AXES[s][2:]) for s, a in arrays.items()}, "float32")
