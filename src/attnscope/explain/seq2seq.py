"""The walkthrough's steps that differ for an encoder-decoder model (T5, BART, mBART, Marian).

Which kind of attention to explain (encoder, decoder or cross), its layer's parameters, where x (and, for
cross-attention, the memory) comes from, and T5's relative position bias as its own step. `attnscope.explain.from_trace`
calls these; every number is the trace's own or recomputed here and compared with it.
"""

from __future__ import annotations

import numpy as np
import torch

from attnscope import families, maths
from attnscope.errors import AttnscopeError
from attnscope.explain.steps import Step
from attnscope.models import ModelLike, load_model
from attnscope.numbers import error
from attnscope.placement import on_host
from attnscope.records.trace import EncoderDecoderTrace, Trace
from attnscope.stages import ATTENTION_LABELS

DEFAULT_KIND = "cross"  # what an encoder-decoder adds to the other families: each target token reading the source


def kind_trace(tr: Trace | EncoderDecoderTrace, attention: str | None) -> Trace:
    """The Trace to explain: an EncoderDecoderTrace's kind (default cross-attention), or tr itself."""
    if isinstance(tr, EncoderDecoderTrace):
        return tr.attention(DEFAULT_KIND if attention is None else attention)
    if attention is None or attention == tr.attention:
        return tr
    if tr.attention == "self":
        raise AttnscopeError(f"attention={attention!r} chooses a kind of an encoder-decoder model's attention "
                             f"(T5, BART, Marian): {tr.model.get('name')} has one kind, so leave attention out",
                             parameter="attention")
    raise AttnscopeError(f"this trace holds the {ATTENTION_LABELS[tr.attention]} only, not {attention!r}: pass the "
                         "whole EncoderDecoderTrace to choose the kind", parameter="attention")


def kind_note(tr: Trace | EncoderDecoderTrace, attention: str | None) -> str:
    """What the walkthrough says about the kind it chose and where the target came from ("" for one kind)."""
    if not isinstance(tr, EncoderDecoderTrace):
        return ""
    chosen = (f" No kind chosen: this is the {ATTENTION_LABELS[DEFAULT_KIND]}, the default (choose encoder, decoder "
              "or cross with attention=, --attention on the command line)." if attention is None else "")
    made = (" The model generated the target greedily (no target given): the decoder's input is its own output."
            if tr.generated else "")
    return chosen + made


def kind_params(model: ModelLike, kind: str, layer: int) -> maths.AttentionParams:
    """One layer's parameters of an encoder-decoder's kind of attention, float32 on the CPU (as the trace)."""
    m = load_model(model)
    if not families.is_encoder_decoder(m.model) or families.family_of(m.model) is None:
        raise AttnscopeError(f"the trace is of an encoder-decoder model's {kind} attention but model={m.name!r} "
                             "is not a known encoder-decoder model: pass the model it was traced with",
                             parameter="model")
    params = families.seq2seq_params(m.model)[kind]
    if layer >= len(params):
        raise AttnscopeError(f"model={m.name!r} has {len(params)} {kind} layers, not the trace's: pass the model it "
                             "was traced with", parameter="model")
    p: maths.AttentionParams = on_host(params[layer])
    return p


def tokens_text(tr: Trace) -> str:
    """The tokens step's words for a kind: which text, and what the decoder's input is."""
    decoder_input = (f"the decoder's input: {len(tr.tokens)} tokens, the decoder start token "
                     f"{tr.tokens[0].text!r} then the target shifted one to the right (teacher forcing: query i "
                     "predicts target token i)")
    if tr.attention == "encoder":
        return f"The encoder reads the source, split into {tr.n_tokens} tokens (special tokens in brackets)."
    if tr.attention == "decoder":
        return f"The decoder's causal self-attention reads {decoder_input}."
    return (f"Cross-attention: the queries are {decoder_input}; the keys are the source's {tr.n_keys} tokens "
            f"(the encoder's), listed in the memory step.")


def input_steps(tr: Trace, a: dict[str, np.ndarray], layer: int, head: int, labels: list[str], keys: list[str],
                p: maths.AttentionParams | None) -> list[Step]:
    """x (and cross-attention's memory): where q, k and v come from, with the numbers that link them."""
    n, d = a["x"].shape
    if tr.attention != "cross":
        stack = "encoder" if tr.attention == "encoder" else "decoder"
        first = "the source's token embeddings" if stack == "encoder" else "the decoder input's token embeddings"
        text = (f"Where x comes from: the {stack}'s hidden state entering layer {layer} (from {first} for layer 0, "
                f"normalised as the family does: {tr.model.get('x_source')}). q, k and v are all computed from it.")
        return [Step("x", "The attention input x", text, f"[token, d_model] = [{n}, {d}]", {"x": a["x"]},
                     row_labels=labels)]
    x_text = (f"Where q comes from: x is the decoder's hidden state at layer {layer}, after that layer's causal "
              "self-attention block (its output added to the residual stream), normalised for cross-attention. "
              f"One row per target token (the queries). ({tr.model.get('x_source')})")
    mem = a.get("memory")
    steps = [Step("x", "The queries' input x: the decoder's hidden state", x_text, f"[target, d_model] = [{n}, {d}]",
                  {"x": a["x"]}, row_labels=labels)]
    if mem is not None:
        steps.append(Step("memory", "The keys' and values' input: the encoder's output (the memory)",
                          _memory_text(tr, a, head, p), f"[source, d_model] = [{mem.shape[0]}, {mem.shape[1]}]",
                          {"memory": mem}, row_labels=keys))
    return steps


def _memory_text(tr: Trace, a: dict[str, np.ndarray], head: int, p: maths.AttentionParams | None) -> str:
    text = ("Where k and v come from: the memory is the encoder's output, its last layer's hidden state after its "
            "final norm, one row per source token. The encoder runs once; every cross-attention layer of the decoder "
            "reads this same memory, each with its own W_K and W_V.")
    checked = tr.check().worst("memory", "model")
    if checked is not None:
        text += (f" The memory each layer received equals the model's own encoder output "
                 f"(encoder_last_hidden_state) within {error(checked)}.")
    if p is not None:
        st = maths.multi_head_attention(torch.from_numpy(a["x"]), p, keep=("q", "k", "v"),
                                        memory=torch.from_numpy(a["memory"]))
        kv = tr.kv_head(head)
        dq = float(np.abs(st["q"][head].numpy() - a["q"][head]).max())
        dk = float(np.abs(st["k"][kv].numpy() - a["k"][kv]).max())
        dv = float(np.abs(st["v"][kv].numpy() - a["v"][kv]).max())
        text += (f" Recomputed here from this layer's weights: q = x W_Q{' + b_Q' if p.b_q is not None else ''} "
                 f"matches head {head}'s captured q within {error(dq)}; k = memory W_K within {error(dk)} and "
                 f"v = memory W_V within {error(dv)}.")
    return text


def position_bias_step(tr: Trace, a: dict[str, np.ndarray], p: maths.AttentionParams | None, h: int, sl: slice,
                       rows: list[str], keys: list[str]) -> list[Step]:
    """T5: the relative position of each query-key pair, its bucket, and the learned bias added to the score."""
    if "position_bias" not in a:
        return []
    bias = a["position_bias"][h]  # [query, key]: what the model added
    n_query, n_key = bias.shape
    relative = np.arange(n_key)[None, :] - np.arange(n_query)[:, None]  # [query, key]: key - query
    arrays: dict[str, np.ndarray] = {"key - query": relative[sl]}
    text = ("T5 has no position embeddings: positions enter here. Each head adds one learned number to each score, "
            "looked up by the bucket of the distance key - query.")
    rb = None if p is None else p.relative_bias
    own: dict[str, tuple[list[str] | None, list[str] | None]] = {}
    if rb is not None:
        n_buckets = int(rb.table.shape[0])
        buckets = maths.relative_position_bucket(torch.from_numpy(relative), rb.bidirectional, n_buckets,
                                                 rb.max_distance).numpy()  # [query, key]
        looked_up = rb.table[:, h].numpy()[buckets]  # [query, key]
        arrays["bucket"] = buckets[sl]
        table_name = f"bias table of head {h} (bucket -> value)"
        arrays[table_name] = rb.table[:, h].numpy()[None, :]  # [1, bucket]
        own = {table_name: ([f"head {h}"], [str(b) for b in range(n_buckets)])}
        half = n_buckets // 2 if rb.bidirectional else n_buckets
        side = (f"The encoder's buckets are bidirectional: {half} for keys at or before the query, {half} for keys "
                "after it." if rb.bidirectional else
                "The decoder's are one-sided: every key after the query falls in bucket 0 (the mask hides it anyway).")
        text += (f" {side} Within each side, one bucket per distance below {half // 2}, then logarithmically wider "
                 f"buckets up to distance {rb.max_distance}; farther keys share the last bucket. The table "
                 f"({n_buckets} buckets x {tr.n_heads} heads) is the first layer's relative_attention_bias: every "
                 f"layer of the stack reuses it. Looked up here, the bias equals the model's within "
                 f"{error(float(np.abs(looked_up - bias).max()))}.")
    arrays["position_bias"] = bias[sl]
    text += " The masked scores below are scaled + position_bias + mask."
    return [Step("position_bias", "Relative position bias (T5)", text, f"[query, key] = [{n_query}, {n_key}]",
                 arrays, rows, keys, array_labels=own)]


def mask_text(tr: Trace) -> str:
    """The cross-attention's mask in words."""
    return ("Cross-attention hides nothing here: every target token may read every source token, before or after "
            "(the source is a single unpadded text; in a padded batch, padded source tokens would get the most "
            "negative float32). The additive mask is all zeros.")


__all__ = ["DEFAULT_KIND", "input_steps", "kind_note", "kind_params", "kind_trace", "mask_text", "position_bias_step",
           "tokens_text"]
