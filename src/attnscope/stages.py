"""The project's vocabulary, defined once: stage names, array axes and view sources.

Imports neither torch nor transformers, so views, the web app's request fields and saved-trace
readers use it without loading a model stack. Code, saved traces, JSON, HTML and docs all use
these names.

Axes: batch, layer, head, kv_head, query, key, token, d_model, d_head, d_rot. Query head h reads
k/v head h // (heads / kv_heads) (grouped-query attention; kv_head = head otherwise). Layers, heads and tokens are
0-indexed everywhere.
"""

from __future__ import annotations

# The steps of one attention layer, in order (attnscope.maths computes each one).
STAGES: tuple[str, ...] = (
    "x",  # the attention input [token, d_model] (cross-attention: the decoder's, for the queries)
    "memory",  # cross-attention: the encoder's output, the input of k and v [key, d_model]
    "q_pre",  # x W_Q + b_Q (then QK-norm) split into heads, before the rotation (RoPE families) [head, token, d_head]
    "k_pre",  # the same for keys [kv_head, token, d_head]
    "position_ids",  # each token's position (RoPE) [token]
    "cos",  # cos(position x theta_i), each angle twice (dims i and i + d_rot/2) [token, d_rot]
    "sin",  # sin(position x theta_i) [token, d_rot]
    "q",  # the queries whose dot products are the scores: x W_Q + b_Q split into heads (rotated) [head, token, d_head]
    "k",  # the keys, one per k/v head (grouped-query attention shares each among several query heads)
    "v",  # x W_V + b_V per k/v head [kv_head, token, d_head]
    "scores",  # q k^T [head, query, key]
    "scaled",  # scores x scaling (1 / sqrt(d_head) usually; T5: 1)
    "position_bias",  # T5: a learned bias per head for each bucket of key - query distance, added [head, query, key]
    "capped",  # softcap x tanh(scaled / softcap) (Gemma 2's logit soft-capping)
    "masked",  # scaled (or capped) + the additive mask (padding, future keys, sliding window)
    "weights",  # softmax over keys (GPT-OSS: with one extra sink logit per head, dropped: rows sum below 1)
    "context",  # weights v [head, query, d_head]
    "merged",  # heads concatenated [token, head * d_head]
    "output",  # merged W_O + b_O [token, d_model]
)

# Stages only some families have: the rotation (RoPE), logit soft-capping, and an encoder-decoder's cross-attention
# input (memory) and T5's relative position bias.
OPTIONAL_STAGES: tuple[str, ...] = ("memory", "q_pre", "k_pre", "position_ids", "cos", "sin", "position_bias",
                                    "capped")

# The stages a trace keeps, and their axes (saved traces, JSON, views), in stage order.
TRACE_STAGES: tuple[str, ...] = ("x", "q", "k", "v", "scores", "weights", "context", "output")

# Derived [query, key] views of the weights, computed on request (attnscope.rollout, attnscope.norms).
# This is also their order in the views' source switch, after the raw weights.
DERIVED: tuple[str, ...] = ("norm_head", "rollout", "norm_layer", "flow")

# The three kinds of attention of an encoder-decoder model (T5, BART, Marian); a decoder-only or encoder-only
# model's trace is of kind "self". A cross-attention trace's queries are target (decoder) tokens and its keys
# source (encoder) tokens: its "key" axis and its k and v run over the source.
ATTENTION_KINDS: tuple[str, ...] = ("encoder", "decoder", "cross")
ATTENTION_LABELS: dict[str, str] = {
    "self": "self-attention",
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention (causal)",
    "cross": "cross-attention (target -> source)",
}

# Every array of a trace and its axes.
ARRAY_AXES: dict[str, tuple[str, ...]] = {
    "x": ("layer", "token", "d_model"),
    "q": ("layer", "head", "token", "d_head"),
    "k": ("layer", "kv_head", "token", "d_head"),  # kv_head = head unless grouped-query attention
    "v": ("layer", "kv_head", "token", "d_head"),
    "scores": ("layer", "head", "query", "key"),
    "position_bias": ("layer", "head", "query", "key"),  # T5 (the first layer's table, shared by every layer)
    "memory": ("key", "d_model"),  # cross-attention: the encoder's output (once: every layer reads the same)
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
