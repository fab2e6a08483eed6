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
from attnscope.tokens import Token
from attnscope.tracing import Trace
from attnscope.views import HTMLPage, display, frame_height, to_html

UNVERIFIED = "weights passed in directly, without their model: nothing to verify them against"
_SPECIAL = re.compile(r"^(\[[A-Z]+\]|<[^<>\s]+>|<\|[a-z_]+\|>)$")


def _prettify(tokens: Sequence[str]) -> list[str]:
    """bertviz's format_special_chars: byte-level and sentencepiece space markers become spaces."""
    return [t.replace("Ġ", " ").replace("▁", " ").replace("</w>", "") for t in tokens]


def _choose(attention: Any, tokens: Any, enc: Any, dec: Any, cross: Any, enc_tokens: Any,
            dec_tokens: Any) -> tuple[Any, Any]:
    """The one self-attention to draw, from bertviz's self-attention or encoder/decoder arguments."""
    others = (enc, dec, cross, enc_tokens, dec_tokens)
    if attention is not None:
        if any(o is not None for o in others):
            raise AttnscopeError("give attention= for a self-attention model, or the encoder/decoder arguments, "
                                 "not both")
        return attention, tokens
    if cross is not None or (enc is not None and dec is not None):
        raise AttnscopeError("attnscope's views draw self-attention: pass encoder_attention or decoder_attention "
                             "alone (cross-attention is not supported)")
    if enc is not None:
        return enc, enc_tokens
    if dec is not None:
        return dec, dec_tokens
    raise AttnscopeError("no attention given: pass attention= (the model's output_attentions tuple) and tokens=")


def _as_array(layer_attention: Any, layer: int) -> np.ndarray:
    detach = getattr(layer_attention, "detach", None)
    raw = detach().float().cpu().numpy() if callable(detach) else layer_attention
    a = np.asarray(raw, dtype=np.float32)
    if a.ndim != 4:
        raise AttnscopeError(f"attention[{layer}] has shape {tuple(a.shape)}: expected (1, heads, tokens, tokens); "
                             "run the model with output_attentions=True")
    if a.shape[0] != 1:
        raise AttnscopeError(f"attention[{layer}] holds a batch of {a.shape[0]}: pass one example, "
                             "e.g. [a[i:i + 1] for a in attention]")
    one: np.ndarray = a[0]  # [head, query, key]
    return one


def stack_attention(attention: Any, tokens: Any) -> np.ndarray:
    """bertviz's input (a tuple of [1, head, query, key] tensors per layer) -> [layer, head, query, key]."""
    if tokens is None:
        raise AttnscopeError("tokens= is required: the list of token strings the attention is over")
    layers = [_as_array(a, i) for i, a in enumerate(attention)]
    if not layers:
        raise AttnscopeError("attention is empty: pass one [1, heads, tokens, tokens] tensor per layer")
    if len({a.shape for a in layers}) != 1:
        raise AttnscopeError(f"attention layers differ in shape: {sorted({a.shape for a in layers})}")
    weights = np.stack(layers).astype(np.float32)
    n = len(tokens)
    if weights.shape[-1] != n or weights.shape[-2] != n:
        raise AttnscopeError(f"attention has {weights.shape[-2]} x {weights.shape[-1]} positions, while there are {n} "
                             "tokens: pass the tokens the model attended over")
    return weights


def trace_from_attention(weights: np.ndarray, tokens: Sequence[str], sentence_b_start: int | None = None) -> Trace:
    """A Trace that carries only given weights [layer, head, query, key] and token strings (unverified)."""
    n = len(tokens)
    if sentence_b_start is not None and not 0 <= sentence_b_start <= n:
        raise AttnscopeError(f"sentence_b_start {sentence_b_start} is outside the {n} tokens (0-indexed)")
    b = n if sentence_b_start is None else sentence_b_start
    toks = [Token(i, str(t), -1, None, None, bool(_SPECIAL.match(str(t))), None, int(i >= b))
            for i, t in enumerate(tokens)]
    causal = n > 1 and not np.triu(weights, 1).any()  # nothing ever attended to a later key
    info = {"name": "weights given to attnscope.bertviz", "architecture": None, "layers": int(weights.shape[0]),
            "heads": int(weights.shape[1]), "causal": bool(causal), "family": None}
    text = " ".join(t.text for t in toks[:b])
    pair = " ".join(t.text for t in toks[b:]) if sentence_b_start is not None else None
    return Trace(info, text, pair, toks, {"weights": weights}, [], unsupported=UNVERIFIED)


def _finish(trace: Trace, html: str, view: str, html_action: str) -> HTMLPage | None:
    page = HTMLPage(html, frame_height(trace, view))
    if html_action == "return":
        return page
    if html_action == "view":
        display(page)
        return None
    raise AttnscopeError(f"html_action {html_action!r} is not known: use 'view' or 'return'")


def _trace_of(attention: Any, tokens: Sequence[str] | None, sentence_b_start: int | None, prettify: bool,
              *alternatives: Any) -> Trace:
    """bertviz's arguments -> a weights-only Trace (the part head_view and model_view share)."""
    att, toks = _choose(attention, tokens, *alternatives)
    weights = stack_attention(att, toks)
    return trace_from_attention(weights, _prettify(toks) if prettify else list(toks), sentence_b_start)


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
    """bertviz.head_view: layer is the first layer shown, heads the heads first selected (0-indexed)."""
    tr = _trace_of(attention, tokens, sentence_b_start, prettify_tokens, encoder_attention, decoder_attention,
                   cross_attention, encoder_tokens, decoder_tokens)
    html = to_html(tr, "head", layers=include_layers, layer=layer, show_heads=heads, title="attnscope head view")
    return _finish(tr, html, "head", html_action)


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
    """bertviz.model_view: every included layer x head; display_mode is "dark" or "light"."""
    tr = _trace_of(attention, tokens, sentence_b_start, prettify_tokens, encoder_attention, decoder_attention,
                   cross_attention, encoder_tokens, decoder_tokens)
    html = to_html(tr, "model", layers=include_layers, heads=include_heads, theme=display_mode,
                   title="attnscope model view")
    return _finish(tr, html, "model", html_action)
