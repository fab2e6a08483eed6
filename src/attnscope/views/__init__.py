"""Interactive attention views: head, model, neuron and matrix, as self-contained HTML.

Python
    to_html(trace, view="all", **options) -> str    a complete page (file://, no network)
    repr_html(trace) -> str                          what a Trace shows in Jupyter (an isolated iframe)
    show(trace, view="head", **options)              display one view in Jupyter
    payload(trace, layers=, heads=, neuron=, compress=, initial=) -> dict   JSON-serialisable data
    neuron_block(trace, layer, head) -> dict         exact numbers of one head, for lazy loading
    bundle() -> str, css() -> str, js() -> str       the page's inlined style and script

Contract for pages that embed the views (the web app):
    1. Inline `bundle()` (or serve `css()` and `js()`); it defines `window.attnscope` and runs nothing.
    2. `await window.attnscope.render(element, payload, options)` draws into `element`.
       `payload` is `payload(trace, ...)` sent as JSON. `options` (all optional) override
       `payload["initial"]`: view ("all", "head", "model", "neuron", "matrix"), layer, head,
       heads (shown in the head view), query (token index), source, theme ("auto", "light",
       "dark"), and loadNeuron: `(layer, head) => Promise<block>` that returns
       `neuron_block(trace, layer, head)` for heads the payload does not carry.
       It resolves to a controller `{state, set(patch), destroy()}`.
    3. Events bubble from `element`: "attnscope:select" when a person picks a matrix cell, a
       neuron-view row or a head-view token, detail `{view, layer, head, query, key, source}`
       (key may be null); "attnscope:ready" when drawn.
Layers, heads and tokens are 0-indexed everywhere, as in the trace.

Sources: every [query, key] array in `trace.arrays` (raw "weights" first, then "norm_head",
"rollout", "norm_layer", "flow" when computed) is offered in the views' source switch.

Encoder-decoder traces (records.trace.EncoderDecoderTrace): one page carries the encoder, decoder and
cross-attention payloads (views/kinds.py) and a selector in every view switches among them.
Cross-attention's queries are the target tokens and its keys the source tokens ("key_tokens").
"""

from __future__ import annotations

import html
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from attnscope.errors import AttnscopeError
from attnscope.views.kinds import family_payload, is_encoder_decoder
from attnscope.views.page import bundle, css, js, page
from attnscope.views.payload import VIEWS, NeuronChoice, neuron_block, payload
from attnscope.views.size import MAX_PAGE_MB, PageTooLarge, family_page_size, page_size, validate_page_size

if TYPE_CHECKING:  # rendering a saved trace imports neither torch nor transformers
    from attnscope.records.trace import EncoderDecoderTrace, Trace

    AnyTrace: TypeAlias = Trace | EncoderDecoderTrace

REPR_VIEW = "all"

__all__ = [
    "VIEWS",
    "HTMLPage",
    "bundle",
    "css",
    "family_html",
    "iframe",
    "js",
    "neuron_block",
    "page",
    "payload",
    "repr_html",
    "show",
    "to_html",
]


def validate_view(view: str) -> str:
    if view not in VIEWS:
        raise AttnscopeError(f"unknown view {view!r}: choose one of {', '.join(VIEWS)}")
    return view


def to_html(
    trace: AnyTrace,
    view: str = "all",
    *,
    layers: Iterable[int] | None = None,
    heads: Iterable[int] | None = None,
    layer: int | None = None,
    head: int | None = None,
    show_heads: Iterable[int] | None = None,
    query: int | None = None,
    source: str | None = None,
    theme: str = "auto",
    neuron: NeuronChoice = "budget",
    title: str | None = None,
    word_level: bool = False,
    attention: str | None = None,
    max_mb: float | None = MAX_PAGE_MB,
    raw_tokens: bool = False,
) -> str:
    """A self-contained HTML page with one view, or all four as tabs (view="all").

    layers, heads: which to include (0-indexed, default all; fewer keeps long texts light).
    layer, head, show_heads, query, source: the starting selection. theme: auto, light, dark.
    neuron: exact data carried for the neuron view ("budget", "all", "none" or (layer, head) pairs).
    word_level: also carry the maps merged into words (views/words.py), behind the page's "words" toggle.
    attention: an encoder-decoder trace's kind drawn first, "encoder" (default), "decoder" or "cross"; the
    page's selector switches among the three (layer, head and query then apply to that kind).
    max_mb: refuse (AttnscopeError naming layers and heads) a page that would exceed this many MB, measured
    before it is built (views/size.py; None: no limit).
    raw_tokens: show tokens as the tokenizer spells its pieces, with byte-level marks ("Ġworld", "Ċ"); by default
    each reads as the tokenizer decodes it (" world", a newline).
    """
    validate_view(view)
    initial = {"view": view, "layer": layer, "head": head, "query": query, "source": source, "theme": theme,
               "heads": None if show_heads is None else list(show_heads)}
    wants_neuron = view in ("neuron", "all")
    if is_encoder_decoder(trace):
        if word_level:
            raise AttnscopeError("word_level is not available for an encoder-decoder trace: leave it False")
        texts = (trace.source, trace.decoder.text if trace.target is None else trace.target)
        return family_html(trace.kinds, texts, initial, layers=layers, heads=heads, attention=attention, title=title,
                           neuron=neuron if wants_neuron else "none", max_mb=max_mb, raw_tokens=raw_tokens)
    if attention not in (None, trace.attention):
        raise AttnscopeError(f"attention={attention!r} is for encoder-decoder traces: this trace is {trace.attention} "
                             "attention alone")
    layers, heads = (None if layers is None else list(layers)), (None if heads is None else list(heads))
    validate_page_size(page_size(trace, layers, heads, neuron if wants_neuron else "none", word_level), max_mb)
    data = payload(trace, layers, heads, neuron if wants_neuron else "none", initial=initial, raw_tokens=raw_tokens)
    if word_level:
        from attnscope.views.words import word_trace

        data["words"] = payload(word_trace(trace), layers, heads, "none", initial=initial | {"query": None},
                                raw_tokens=raw_tokens)
    return page(data, title or f"attnscope {view} view: {_short(trace.text)}")


def family_html(
    kinds: Mapping[str, Trace],
    texts: tuple[str, str | None],
    initial: dict[str, Any],
    *,
    layers: Iterable[int] | None = None,
    heads: Iterable[int] | None = None,
    attention: str | None = None,
    title: str | None = None,
    neuron: NeuronChoice = "budget",
    max_mb: float | None = MAX_PAGE_MB,
    raw_tokens: bool = False,
) -> str:
    """One page of some of an encoder-decoder's kinds of attention ("encoder", "decoder", "cross" -> Trace), with
    the selector among them; texts: (source, target) for the header; initial: as to_html's, for the first kind;
    max_mb, raw_tokens: as to_html's, max_mb for the kinds together."""
    layers, heads = (None if layers is None else list(layers)), (None if heads is None else list(heads))
    validate_page_size(family_page_size(kinds, layers, heads, neuron), max_mb)
    data = family_payload(kinds, texts, layers, heads, neuron, initial, attention, raw_tokens)
    return page(data, title or f"attnscope {initial.get('view') or 'all'} view: {_short(texts[0])}")


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def iframe(document: str, height: int = 640) -> str:
    """`document` in a sandboxed, resizable iframe: its scripts run isolated from the notebook."""
    return (
        f'<div class="attnscope-frame" style="resize:vertical;overflow:hidden;height:{int(height)}px;'
        'min-height:200px;border:1px solid rgba(127,127,127,.35);border-radius:6px">'
        f'<iframe sandbox="allow-scripts" srcdoc="{html.escape(document, quote=True)}" '
        'style="width:100%;height:100%;border:0" title="attnscope view"></iframe></div>'
    )


def frame_height(trace: AnyTrace, view: str) -> int:
    """A first height for a notebook frame (people can drag it taller): what the view needs, within 320-760 px."""
    if is_encoder_decoder(trace):  # the tallest of its kinds
        return max(frame_height(t, view) for t in trace.kinds.values())
    rows = max(trace.n_tokens, trace.n_keys)  # cross-attention: the longer of target and source
    needs = {"head": 20 * rows + 190, "neuron": 22 * rows + 240, "matrix": 640, "model": 66 * trace.n_layers + 200}
    need = max(needs.values()) if view == "all" else needs[view]
    return max(320, min(760, need))


class HTMLPage:
    """A rendered page: `.data` is the HTML (as in bertviz's `html_action="return"`); shows itself in Jupyter."""

    def __init__(self, data: str, height: int = 640) -> None:
        self.data = data
        self.height = height

    def _repr_html_(self) -> str:
        return iframe(self.data, self.height)

    def save(self, path: str | os.PathLike[str]) -> Path:
        p = Path(path)
        try:
            p.write_text(self.data, encoding="utf-8")
        except OSError as exc:
            raise AttnscopeError(f"cannot write {p}: {exc.strerror or exc}") from exc
        return p

    def __str__(self) -> str:
        return self.data


def repr_html(trace: AnyTrace) -> str:
    """The notebook display of a Trace: every view, as tabs, in an isolated iframe (a long trace over the page
    size limit: one line that says how to show part of it)."""
    try:
        return iframe(to_html(trace, REPR_VIEW), frame_height(trace, REPR_VIEW))
    except PageTooLarge as exc:
        return (f"<p>{html.escape(str(exc))}; for example "
                "<code>trace.show(\"matrix\", layers=[0], heads=[0])</code></p>")


def display(page_: HTMLPage) -> None:
    """Show a page in the running IPython/Jupyter front end."""
    try:
        from IPython import get_ipython
        from IPython.display import display as ipython_display
    except ImportError as exc:
        raise AttnscopeError("show() needs Jupyter (IPython): use to_html() and open the file instead") from exc
    if get_ipython() is None:
        raise AttnscopeError("show() displays in Jupyter: outside it, write trace.to_html() to a file "
                             "or run `attnscope view TEXT -o view.html`")
    shown: Callable[[HTMLPage], object] = ipython_display
    shown(page_)


def show(trace: AnyTrace, view: str = "head", **options: Any) -> None:
    """Display one view (head, model, neuron, matrix or all) in Jupyter."""
    display(HTMLPage(to_html(trace, view, **options), frame_height(trace, view)))
