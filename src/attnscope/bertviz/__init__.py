"""bertviz's `head_view`, `model_view` and `neuron_view.show`, with bertviz's own arguments, drawn by attnscope.

Switch with one import: `from attnscope.bertviz import head_view, model_view`, and
`from attnscope.bertviz.neuron_view import show` (which traces the model, so its page is verified). The page is
self-contained (no CDN), compact (uint8 maps) and isolated in an iframe in Jupyter.
`html_action="view"` displays it in Jupyter; `"return"` returns an object whose `.data` is
the HTML, as bertviz's IPython HTML object has. Weights passed in this way come without the
model, so the page says they are not verified; `attnscope.trace(...)` gives verified views.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from attnscope.errors import AttnscopeError
from attnscope.records.trace import Trace
from attnscope.tokens import Token
from attnscope.views import HTMLPage, display, family_html, frame_height, to_html

UNVERIFIED = "weights passed in directly, without their model: nothing to verify them against"
_SPECIAL = re.compile(r"^(\[[A-Z]+\]|<[^<>\s]+>|<\|[a-z_]+\|>)$")


def _prettify(tokens: Sequence[str]) -> list[str]:
    """bertviz's format_special_chars: byte-level and sentencepiece space markers become spaces."""
    return [t.replace("Ġ", " ").replace("▁", " ").replace("</w>", "") for t in tokens]


# bertviz's encoder-decoder arguments: kind -> (its attention argument, the tokens of its queries, of its keys).
KIND_ARGUMENTS: dict[str, tuple[str, str, str]] = {
    "encoder": ("encoder_attention", "encoder_tokens", "encoder_tokens"),
    "decoder": ("decoder_attention", "decoder_tokens", "decoder_tokens"),
    "cross": ("cross_attention", "decoder_tokens", "encoder_tokens"),  # queries: target; keys: source
}
_AXES = {"tokens": "tokens", "encoder_tokens": "encoder tokens", "decoder_tokens": "decoder tokens"}
NO_SDPA = "load the model with attn_implementation='eager' (or output_attentions=True): sdpa returns no weights"
EMPTY_OUTPUTS = ("attention is empty: outputs[-1] is the empty cross-attention of an encoder (transformers 5 "
                 "ends an encoder's outputs with cross_attentions=()): pass outputs.attentions; if that is empty "
                 f"too, {NO_SDPA}")


def _shape(rows: str, cols: str) -> str:
    return f"(1, heads, {_AXES[rows]}, {_AXES[cols]})"


def _as_array(layer_attention: Any, layer: int, name: str, expected: str) -> np.ndarray:
    detach = getattr(layer_attention, "detach", None)
    raw = detach().float().cpu().numpy() if callable(detach) else layer_attention
    a = np.asarray(raw, dtype=np.float32)
    if a.ndim != 4:
        raise AttnscopeError(f"{name}[{layer}] has shape {tuple(a.shape)}: expected {expected}; "
                             "run the model with output_attentions=True")
    if a.shape[0] != 1:
        raise AttnscopeError(f"{name}[{layer}] holds a batch of {a.shape[0]}: pass one example, "
                             f"e.g. [a[i:i + 1] for a in {name}]")
    one: np.ndarray = a[0]  # [head, query, key]
    return one


def stack_attention(attention: Any, tokens: Any, key_tokens: Any = None, name: str = "attention",
                    axes: tuple[str, str] = ("tokens", "tokens")) -> np.ndarray:
    """bertviz's input (a tuple of [1, head, query, key] tensors per layer) -> [layer, head, query, key].

    key_tokens: the keys' tokens when they are not the queries' (cross-attention: the encoder's); name and
    axes: the argument and its token arguments, as error messages say them.
    """
    if tokens is None:
        raise AttnscopeError(f"{axes[0]}= is required: the list of token strings the attention is over")
    expected = _shape(*axes)
    layers = [_as_array(a, i, name, expected) for i, a in enumerate(attention)]
    if not layers:
        raise AttnscopeError(EMPTY_OUTPUTS if name == "attention" else
                             f"{name} is empty: pass one {expected} tensor per layer (outputs.{name}s); {NO_SDPA}")
    if len({a.shape for a in layers}) != 1:
        raise AttnscopeError(f"{name} layers differ in shape: {sorted({a.shape for a in layers})}")
    weights = np.stack(layers).astype(np.float32)  # [layer, head, query, key]
    keys = tokens if key_tokens is None else key_tokens
    if weights.shape[-2] != len(tokens) or weights.shape[-1] != len(keys):
        counts = (f"{len(tokens)} tokens" if axes[0] == axes[1] == "tokens" else
                  f"{len(tokens)} {axes[0]} and {len(keys)} {axes[1]}" if axes[0] != axes[1] else
                  f"{len(tokens)} {axes[0]}")
        raise AttnscopeError(f"{name} has {weights.shape[-2]} x {weights.shape[-1]} positions, while there are "
                             f"{counts}: pass the tokens the model attended over (expected {expected})")
    return weights


def _kinds(given: dict[str, Any], tokens: dict[str, Any], prettify: bool) -> dict[str, Trace]:
    """bertviz's encoder/decoder/cross arguments -> one weights-only Trace per kind given, as bertviz checks them."""
    traces: dict[str, Trace] = {}
    for kind, (name, rows, cols) in KIND_ARGUMENTS.items():
        if given[name] is None:
            continue
        for arg in (rows, cols):
            if tokens[arg] is None:
                raise AttnscopeError(f"{arg}= is required with {name}: the token strings of its {_AXES[arg]}")
        queries, keys = ([_prettify(tokens[a]) if prettify else list(tokens[a]) for a in (rows, cols)])
        weights = stack_attention(given[name], queries, keys, name, (rows, cols))
        traces[kind] = trace_from_attention(weights, queries, key_tokens=keys if kind == "cross" else None,
                                            attention=kind)
    return traces


def _tokens(tokens: Sequence[str], segment_b: int) -> list[Token]:
    return [Token(index=i, text=str(t), id=-1, special=bool(_SPECIAL.match(str(t))), segment=int(i >= segment_b))
            for i, t in enumerate(tokens)]


def trace_from_attention(weights: np.ndarray, tokens: Sequence[str], sentence_b_start: int | None = None,
                         key_tokens: Sequence[str] | None = None, attention: str = "self") -> Trace:
    """A Trace that carries only given weights [layer, head, query, key] and token strings (unverified).

    key_tokens: cross-attention's source tokens (the keys); attention: "self", "encoder", "decoder" or "cross".
    """
    n = len(tokens)
    if sentence_b_start is not None and not 0 <= sentence_b_start <= n:
        raise AttnscopeError(f"sentence_b_start {sentence_b_start} is outside the {n} tokens (0-indexed)")
    b = n if sentence_b_start is None else sentence_b_start
    toks = _tokens(tokens, b)
    # nothing ever attended to a later key; a cross-attention's keys are another text's tokens
    causal = key_tokens is None and n > 1 and not np.triu(weights, 1).any()
    info = {"name": "weights given to attnscope.bertviz", "architecture": None, "layers": int(weights.shape[0]),
            "heads": int(weights.shape[1]), "causal": bool(causal), "family": None}
    text = " ".join(t.text for t in toks[:b])
    pair = " ".join(t.text for t in toks[b:]) if sentence_b_start is not None else None
    keys = None if key_tokens is None else _tokens(key_tokens, len(key_tokens))
    return Trace(model=info, text=text, pair=pair, tokens=toks, arrays={"weights": weights}, scaling=[],
                 unsupported=UNVERIFIED, attention=attention,
                 key_tokens=keys)


def _finish(traces: Trace | Sequence[Trace], html: str, view: str, html_action: str) -> HTMLPage | None:
    shown = [traces] if isinstance(traces, Trace) else list(traces)
    page = HTMLPage(html, max(frame_height(t, view) for t in shown))
    if html_action == "return":
        return page
    if html_action == "view":
        display(page)
        return None
    raise AttnscopeError(f"html_action {html_action!r} is not known: use 'view' or 'return'")


def _traces_of(attention: Any, tokens: Sequence[str] | None, sentence_b_start: int | None, prettify: bool,
               given: dict[str, Any], kind_tokens: dict[str, Any]) -> dict[str, Trace]:
    """bertviz's arguments -> weights-only Traces by kind: {"self": ...}, or some of encoder, decoder and cross."""
    if attention is not None:
        if any(v is not None for v in (*given.values(), *kind_tokens.values())):
            raise AttnscopeError("give attention= for a self-attention model, or the encoder/decoder arguments, "
                                 "not both")
        weights = stack_attention(attention, tokens)
        toks = _prettify(tokens) if prettify and tokens is not None else list(tokens or [])
        return {"self": trace_from_attention(weights, toks, sentence_b_start)}
    if all(v is None for v in given.values()):
        raise AttnscopeError("no attention given: pass attention= (the model's output_attentions tuple) and tokens=, "
                             "or encoder_attention=, decoder_attention=, cross_attention= with encoder_tokens=, "
                             "decoder_tokens=")
    if sentence_b_start is not None:
        raise AttnscopeError("sentence_b_start is for attention= (a sentence pair): the encoder-decoder arguments "
                             "take encoder_tokens= and decoder_tokens= instead")
    return _kinds(given, kind_tokens, prettify)


def _page(traces: dict[str, Trace], view: str, initial: dict[str, Any], layers: Sequence[int] | None,
          heads: Sequence[int] | None) -> str:
    """The page of one self-attention, or of the encoder-decoder kinds given with the selector among them."""
    title = f"attnscope {view} view"
    if "self" in traces:
        return to_html(traces["self"], view, layers=layers, heads=heads, title=title, **initial)
    src, tgt = traces.get("encoder") or traces.get("cross"), traces.get("decoder") or traces.get("cross")
    source = None if src is None else " ".join(t.text for t in src.keys)  # the encoder's tokens
    target = None if tgt is None else " ".join(t.text for t in tgt.tokens)  # the decoder's
    texts = (source, target) if source is not None else (target or "", None)
    start = {"view": view, **{("heads" if k == "show_heads" else k): v for k, v in initial.items()}}
    return family_html(traces, texts, start, layers=layers, heads=heads, title=title)


def head_view(
    attention: Any = None,
    tokens: Sequence[str] | None = None,
    sentence_b_start: int | None = None,
    prettify_tokens: bool = True,
    layer: int | None = None,
    heads: Sequence[int] | None = None,
    encoder_attention: Any = None,
    decoder_attention: Any = None,
    cross_attention: Any = None,
    encoder_tokens: Sequence[str] | None = None,
    decoder_tokens: Sequence[str] | None = None,
    include_layers: Sequence[int] | None = None,
    html_action: str = "view",
) -> HTMLPage | None:
    """bertviz.head_view: layer is the first layer shown, heads the heads first selected (0-indexed).

    Encoder-decoder models: any of encoder_attention, decoder_attention, cross_attention (each a tuple of
    (1, heads, query tokens, key tokens) per layer; cross: (1, heads, decoder tokens, encoder tokens)) with
    encoder_tokens and decoder_tokens; the page's selector switches among the kinds given.
    """
    traces = _traces_of(attention, tokens, sentence_b_start, prettify_tokens,
                        {"encoder_attention": encoder_attention, "decoder_attention": decoder_attention,
                         "cross_attention": cross_attention},
                        {"encoder_tokens": encoder_tokens, "decoder_tokens": decoder_tokens})
    html = _page(traces, "head", {"layer": layer, "show_heads": heads}, include_layers, None)
    return _finish(list(traces.values()), html, "head", html_action)


def model_view(
    attention: Any = None,
    tokens: Sequence[str] | None = None,
    sentence_b_start: int | None = None,
    prettify_tokens: bool = True,
    display_mode: str = "dark",
    encoder_attention: Any = None,
    decoder_attention: Any = None,
    cross_attention: Any = None,
    encoder_tokens: Sequence[str] | None = None,
    decoder_tokens: Sequence[str] | None = None,
    include_layers: Sequence[int] | None = None,
    include_heads: Sequence[int] | None = None,
    html_action: str = "view",
) -> HTMLPage | None:
    """bertviz.model_view: every included layer x head; display_mode is "dark" or "light".

    Encoder-decoder models: the arguments of head_view; the selector switches among the kinds given.
    """
    traces = _traces_of(attention, tokens, sentence_b_start, prettify_tokens,
                        {"encoder_attention": encoder_attention, "decoder_attention": decoder_attention,
                         "cross_attention": cross_attention},
                        {"encoder_tokens": encoder_tokens, "decoder_tokens": decoder_tokens})
    html = _page(traces, "model", {"theme": display_mode}, include_layers, include_heads)
    return _finish(list(traces.values()), html, "model", html_action)
