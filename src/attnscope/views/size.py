"""How big a self-contained page of a trace would be, measured before it is built, and the limit on it.

A page carries every selected layer x head map of every source as uint8 (one byte per cell, base64:
4/3 of that), the exact float32 neuron data, and the views' script. The estimate counts the maps at
their uncompressed size, so it is an upper bound: zlib makes most pages smaller (attention is sparse).
A 2,048-token map is 4.2 M cells, 5.6 MB in the page: `layers` and `heads` choose which a page carries.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnscope.errors import AttnscopeError
from attnscope.stages import ARRAY_AXES
from attnscope.views.payload import NEURON_BUDGET, NeuronChoice, block_stages, select, source_names

if TYPE_CHECKING:
    from collections.abc import Mapping

    from attnscope.records.trace import Trace

MAX_PAGE_MB = 50.0  # the default limit on a page's size, in MB (10^6 bytes)
BASE64 = 4 / 3
SCRIPT_BYTES = 300_000  # the inlined CSS and JS, with room to grow


class PageTooLarge(AttnscopeError):
    """A page over the size limit (the notebook display shows the message instead of a page)."""


@dataclass(frozen=True)
class PageSize:
    """The estimate: bytes in all, and what they carry (for the message that refuses a page)."""

    total: int
    maps: int  # [query, key] maps carried
    cells: int  # cells of one map
    layers: int
    heads: int
    neuron: int = 0  # bytes of the neuron view's exact float32 numbers (in the page: 4/3 of them)


def page_size(trace: Trace, layers: Iterable[int] | None = None, heads: Iterable[int] | None = None,
              neuron: NeuronChoice = "none", word_level: bool = False, budget: int = NEURON_BUDGET) -> PageSize:
    """The bytes a page of `trace` with these layers and heads (0-indexed, None = all) would take, at most.

    budget: the bytes of exact neuron data carried with neuron="budget" (an encoder-decoder page shares it)."""
    sel = select(trace, layers, heads)
    maps = 0
    cells = 0
    for name in source_names(trace):
        axes = ARRAY_AXES[name]
        shape = trace.arrays[name].shape
        cells = int(shape[-2] * shape[-1])
        maps += (len(sel.layers) if "layer" in axes else 1) * (len(sel.heads) if "head" in axes else 1)
    total = maps * cells * (2 if word_level else 1)  # words: at most as many as tokens
    exact = _neuron_bytes(trace, len(sel.layers) * len(sel.heads), neuron, budget)
    return PageSize(int((total + exact) * BASE64) + SCRIPT_BYTES, maps, cells, len(sel.layers), len(sel.heads),
                    int(exact * BASE64))


def family_page_size(kinds: Mapping[str, Trace], layers: Iterable[int] | None = None,
                     heads: Iterable[int] | None = None, neuron: NeuronChoice = "none") -> PageSize:
    """An encoder-decoder page (views/kinds.py): the sum of its kinds' pages, carrying the script once and
    sharing the neuron budget among them as family_payload does. maps: summed over the kinds; cells, layers,
    heads: the most of any kind (layers and heads choose the same for each kind)."""
    layers, heads = (None if layers is None else list(layers)), (None if heads is None else list(heads))
    sizes = [page_size(t, layers, heads, neuron, budget=NEURON_BUDGET // max(1, len(kinds))) for t in kinds.values()]
    return PageSize(sum(s.total - SCRIPT_BYTES for s in sizes) + SCRIPT_BYTES, sum(s.maps for s in sizes),
                    max((s.cells for s in sizes), default=0), max((s.layers for s in sizes), default=0),
                    max((s.heads for s in sizes), default=0), sum(s.neuron for s in sizes))


def _neuron_bytes(trace: Trace, pairs: int, neuron: NeuronChoice, budget: int = NEURON_BUDGET) -> int:
    """The exact float32 data for the neuron view: `pairs` heads' worth, or the budget (at least one head)."""
    if neuron == "none" or "q" not in trace.arrays:
        return 0
    per_pair = int(sum(trace.arrays[s][0, 0].nbytes for s in block_stages(trace)))
    if not isinstance(neuron, str):
        return per_pair * len(list(neuron))
    return per_pair * pairs if neuron == "all" else min(per_pair * pairs, max(per_pair, budget))


def validate_page_size(size: PageSize, max_mb: float | None, flags: bool = False) -> None:
    """Refuse a page over `max_mb` MB with one line naming what makes it smaller (flags: in the CLI's words)."""
    if max_mb is None:
        return
    if not max_mb > 0:
        raise AttnscopeError(f"{'--max-mb' if flags else 'max_mb'} must be above 0, got {max_mb:g}",
                             parameter=None if flags else "max_mb")
    if size.total <= max_mb * 1e6:
        return
    fewer = "fewer --layers and --heads (0-indexed, e.g. --layers 0,3 --heads 1,2)" if flags else \
        "fewer layers= and heads= (0-indexed, e.g. layers=[0, 3], heads=[1, 2])"
    limit = f"--max-mb {max_mb:g}" if flags else f"max_mb={max_mb:g}"
    if size.neuron:  # the neuron view's exact numbers alone can be most of a long page
        fewer += (", or --neuron none" if flags else ", or neuron='none'") + \
            f" (the neuron view's exact numbers take {size.neuron / 1e6:.2g} MB)"
    raise PageTooLarge(
        f"this page would be up to {size.total / 1e6:.2g} MB ({size.layers} layers x {size.heads} heads, "
        f"{size.maps} maps of {size.cells:,} cells), over the {limit} limit: pass {fewer}, or raise "
        f"{'--max-mb' if flags else 'max_mb'}")
