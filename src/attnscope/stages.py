"""The project's vocabulary, defined once: stage names, array axes and view sources.

Imports neither torch nor transformers, so views, the web app's request fields and saved-trace
readers use it without loading a model stack. Code, saved traces, JSON, HTML and docs all use
these names.

Axes: batch, layer, head, query, key, token, d_model, d_head. Layers, heads and tokens are
0-indexed everywhere.
"""

from __future__ import annotations

# The steps of one attention layer, in order (attnscope.maths computes each one).
STAGES: tuple[str, ...] = (
    "x",  # the attention input [token, d_model]
    "q",  # x W_Q + b_Q, split into heads [head, token, d_head]
    "k",
    "v",
    "scores",  # q k^T [head, query, key]
    "scaled",  # scores x scaling (1 / sqrt(d_head) usually)
    "masked",  # scaled + the additive mask (padding, future keys)
    "weights",  # softmax over keys
    "context",  # weights v [head, query, d_head]
    "merged",  # heads concatenated [token, head * d_head]
    "output",  # merged W_O + b_O [token, d_model]
)

# The stages a trace keeps, and their axes (saved traces, JSON, views), in stage order.
TRACE_STAGES: tuple[str, ...] = ("x", "q", "k", "v", "scores", "weights", "context", "output")

# Derived [query, key] views of the weights, computed on request (attnscope.rollout, attnscope.norms).
# This is also their order in the views' source switch, after the raw weights.
DERIVED: tuple[str, ...] = ("norm_head", "rollout", "norm_layer", "flow")

# Every array of a trace and its axes.
ARRAY_AXES: dict[str, tuple[str, ...]] = {
    "x": ("layer", "token", "d_model"),
    "q": ("layer", "head", "token", "d_head"),
    "k": ("layer", "head", "token", "d_head"),
    "v": ("layer", "head", "token", "d_head"),
    "scores": ("layer", "head", "query", "key"),
    "weights": ("layer", "head", "query", "key"),
    "context": ("layer", "head", "token", "d_head"),
    "output": ("layer", "token", "d_model"),
    "norm_head": ("layer", "head", "query", "key"),
    "rollout": ("layer", "query", "key"),
    "norm_layer": ("layer", "query", "key"),
    "flow": ("query", "key"),
}
ARRAYS: tuple[str, ...] = (*TRACE_STAGES, *DERIVED)  # every array name, stages first
TOKEN_AXES = ("token", "query", "key")  # axes that run over a text's tokens (cut to its length when unpadding)

# The views' sources: the [query, key] arrays they can draw, raw weights first, and their labels.
SOURCES: tuple[str, ...] = ("weights", *DERIVED)
SOURCE_LABELS: dict[str, str] = {
    "weights": "attention weights",
    "norm_head": "norm-based, per head",
    "rollout": "attention rollout",
    "norm_layer": "norm-based, per layer",
    "flow": "attention flow",
}
