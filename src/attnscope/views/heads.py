"""Heads grouped by what they do (corpus/head_groups.py) as a view: the dendrogram of the clustering and the 2-D map of
the heads (classical MDS of their mean Jensen-Shannon distances), each head coloured by its first behaviour label, the
label counts, and, given a second model's grouping, the two models side by side (label counts, nearest heads by
behaviour).

Python builds a JSON payload (`heads_payload`); assets/heads.js draws it (`window.attnscope.renderHeads`). With a trace
of an example sentence alongside (`trace=`), a click on a head opens that layer and head in the attention views below
(as the intervention grids do). Self-contained page, Jupyter (`heads_page` is an HTMLPage), SVG/PNG/PDF figures by
headless Chromium (`heads_figure`). Layers and heads are 0-indexed; a head is named "layer.head".
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnscope.errors import AttnscopeError
from attnscope.views.page import css, standalone, view_script

if TYPE_CHECKING:
    from attnscope.corpus.head_groups import Comparison, HeadGroups
    from attnscope.records.trace import Trace
    from attnscope.views import HTMLPage

FORMAT = "attnscope.heads/1"
ROOT = "attnscope-heads-root"
DATA = "attnscope-heads"
BOOT = "\nwindow.attnscope.bootHeads();\n"
STYLE = """
.as-hd { font: 14px system-ui, sans-serif; margin: 12px; color: #111; }
.as-hd h2 { font-size: 17px; margin: 4px 0; }
.as-hd h3 { font-size: 15px; margin: 14px 0 6px; }
.as-hd-note { color: #555; margin: 4px 0 10px; max-width: 1100px; }
.as-hd-figure svg { background: #fff; }
.as-hd-figure [data-unit] { cursor: pointer; }
.as-hd-figure circle[data-unit]:hover { stroke: #000; stroke-width: 2; }
.as-hd-table { border-collapse: collapse; margin: 6px 0 12px; }
.as-hd-table th, .as-hd-table td { padding: 2px 10px; text-align: left; border-bottom: 1px solid #eee; }
.as-hd-table td.num { text-align: right; font: 12px ui-monospace, monospace; }
.as-hd-picked { margin: 6px 0; min-height: 1.4em; }
"""


def heads_payload(g: HeadGroups, comparison: Comparison | None = None) -> dict[str, Any]:
    """A JSON-serialisable description of a grouping that `window.attnscope.renderHeads` draws (distances left out:
    the dendrogram and the map carry them)."""
    d = g.to_dict()
    d.pop("distance")
    return {"format": FORMAT, "title": f"{g.model}: {g.layers} layers x {g.heads} heads grouped by what they do",
            "note": f"{g.documents} sentences, {g.tokens} tokens; distance: the Jensen-Shannon distance of two heads' "
                    "attention rows, averaged over tokens; clustering: average linkage (UPGMA); map: classical MDS "
                    "of the same distances",
            **d, "comparison": None if comparison is None else comparison.to_dict()}


def heads_html(g: HeadGroups, trace: Trace | None = None, comparison: Comparison | None = None) -> str:
    """A self-contained page: the dendrogram, the map, the labels, and (with a trace) the attention views a click on
    a head opens."""
    data = heads_payload(g, comparison)
    if trace is not None and trace.model.get("name") != g.model:
        raise AttnscopeError(f"the trace is of {trace.model.get('name')}, the heads of {g.model}: trace a sentence "
                             f"with {g.model}", parameter="trace")
    blocks: dict[str, Any] = {DATA: data}
    if trace is not None:
        from attnscope.views.payload import payload

        initial = {"view": "head", "layer": 0, "head": 0, "query": None, "source": None, "theme": "light",
                   "heads": [0]}
        blocks["attnscope-data"] = payload(trace, None, None, "none", initial=initial)
    return standalone(data["title"], view_script("heads.js", BOOT), css() + "\n" + STYLE, [ROOT, "attnscope-root"],
                      blocks)


def heads_page(g: HeadGroups, trace: Trace | None = None, comparison: Comparison | None = None) -> HTMLPage:
    """The page as an HTMLPage: shows itself in Jupyter (an isolated iframe), .save(path) writes it."""
    from attnscope.views import HTMLPage

    return HTMLPage(heads_html(g, trace, comparison), height=900 if trace is not None else 760)


def heads_figure(g: HeadGroups, path: str | os.PathLike[str], fmt: str | None = None, scale: float = 2.0,
                 caption: bool = True) -> Path:
    """The dendrogram and the map as a figure (svg, png or pdf, from fmt or the file's suffix), drawn by the page's
    own script in headless Chromium."""
    from attnscope.views.figures import MAX_SCALE, figure_format, render_figure

    kind = figure_format(path, fmt)
    if not 0 < scale <= MAX_SCALE:
        raise AttnscopeError(f"scale must be above 0 and at most {MAX_SCALE:g}, got {scale:g}", parameter="scale")
    return render_figure(heads_html(g), Path(path), kind, scale, root=ROOT, caption=caption)


__all__ = ["FORMAT", "heads_figure", "heads_html", "heads_page", "heads_payload"]
