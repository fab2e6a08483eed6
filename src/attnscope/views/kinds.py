"""Encoder-decoder pages: an encoder-decoder model's encoder, decoder and cross-attention on one page.

Each kind of attention is its own payload (views.payload), drawn by the same views; the first one
carries the others under "kinds" and a selector in every view swaps which one is drawn
(assets/controls.js). Cross-attention is not square: its queries are the target (decoder) tokens and
its keys the source (encoder) tokens, which its payload carries as "key_tokens".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from attnscope.errors import AttnscopeError
from attnscope.stages import ATTENTION_KINDS, ATTENTION_LABELS
from attnscope.views.payload import NEURON_BUDGET, NeuronChoice, payload, select

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # typing's own from Python 3.13

    from attnscope.records.trace import EncoderDecoderTrace, Trace


def is_encoder_decoder(trace: Trace | EncoderDecoderTrace) -> TypeIs[EncoderDecoderTrace]:
    """An encoder-decoder trace holds its three kinds; a Trace is one kind. Told by that, not by isinstance:
    records call views (Trace.to_html), so views never import records when they run."""
    return hasattr(trace, "kinds")


def kinds_of(trace: Trace | EncoderDecoderTrace) -> dict[str, Trace] | None:
    """An encoder-decoder trace's three kinds of attention, in order; None for a single trace."""
    return trace.kinds if is_encoder_decoder(trace) else None


def validate_kinds(kinds: Mapping[str, Trace], attention: str | None) -> str:
    """The kind drawn first: `attention`, or the first one given; every name one of ATTENTION_KINDS."""
    if not kinds:
        raise AttnscopeError("no attention to draw: give at least one of encoder, decoder or cross")
    for kind in kinds:
        if kind not in ATTENTION_KINDS:
            raise AttnscopeError(f"attention {kind!r} is not one of an encoder-decoder's: use encoder, decoder "
                                 "or cross")
    first = attention or next(iter(kinds))
    if first not in kinds:
        raise AttnscopeError(f"attention {first!r} is not on this page: it has {', '.join(kinds)}")
    return first


def _carried(initial: dict[str, Any], trace: Trace, layers: Iterable[int] | None,
             heads: Iterable[int] | None) -> dict[str, Any]:
    """The starting state for a kind drawn later: the view and theme, and the layer and head where it has them."""
    sel = select(trace, layers, heads)
    kept = {k: initial.get(k) for k in ("view", "theme")}
    if initial.get("layer") in sel.layers:
        kept["layer"] = initial["layer"]
    if initial.get("head") in sel.heads:
        kept["head"] = initial["head"]
    return kept


def family_payload(
    kinds: Mapping[str, Trace],
    texts: tuple[str, str | None],
    layers: Iterable[int] | None = None,
    heads: Iterable[int] | None = None,
    neuron: NeuronChoice = "budget",
    initial: dict[str, Any] | None = None,
    attention: str | None = None,
    raw_tokens: bool = False,
) -> dict[str, Any]:
    """The payload of the kind drawn first, carrying every kind's payload under "kinds" (itself as null).

    texts: (source, target) shown in the page's header. layers, heads apply to each kind (0-indexed);
    the neuron budget is shared among the kinds. raw_tokens: as payload's.
    """
    first = validate_kinds(kinds, attention)
    given = dict(initial or {})
    layers, heads = (None if layers is None else list(layers)), (None if heads is None else list(heads))
    out: dict[str, dict[str, Any]] = {}
    for kind, trace in kinds.items():
        start = given if kind == first else _carried(given, trace, layers, heads)
        data = payload(trace, layers, heads, neuron, initial=start, budget=NEURON_BUDGET // len(kinds),
                       raw_tokens=raw_tokens)
        out[kind] = data | {"attention": kind, "attention_label": ATTENTION_LABELS[kind], "text": texts[0],
                            "pair": texts[1]}
    top = out[first]
    top["kinds"] = {kind: None if kind == first else data for kind, data in out.items()}
    return top
