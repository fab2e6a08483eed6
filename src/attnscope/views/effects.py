"""The layer x head effect grid of an intervention (ablate --each, patch) as a heatmap page.

Python builds a JSON payload; assets/effects.js draws it. With the text's trace alongside, a click on a
cell opens that head (0-indexed) in the head and neuron views below the grid. Torch-free.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnscope.errors import AttnscopeError
from attnscope.views.page import css, standalone, view_script

if TYPE_CHECKING:
    from attnscope.records.trace import Trace

ROOT_EFFECTS = "attnscope-effects-root"
DATA_EFFECTS = "attnscope-effects"
BOOT = "\nwindow.attnscope.bootEffects();\n"
STYLE = """
.as-fx { font: 14px system-ui, sans-serif; margin: 12px; }
.as-fx-note { color: #666; margin: 4px 0 12px; }
.as-fx-grid { border-collapse: collapse; margin-bottom: 16px; }
.as-fx-grid th { font-weight: 500; padding: 2px 6px; color: #555; }
.as-fx-cell { border: 0; width: 100%; min-width: 62px; padding: 3px 4px; font: 11px ui-monospace, monospace;
  color: #111; cursor: pointer; }
.as-fx-cell:focus-visible, .as-fx-cell:hover { outline: 2px solid #333; }
"""
LABELS = {
    "d_target_logprob": "change of the target's log-probability",
    "d_loss": "change of the loss",
    "embedding_distance": "cosine distance of the pooled sentence embedding",
    "mean_token_change": "mean relative change of the tokens' final states",
    "denoised": "recovered: each clean head patched into the corrupt run",
    "noised": "lost: each corrupt head patched into the clean run",
}


def _finite(grid: Any) -> list[list[float | None]]:
    """The grid as JSON numbers; NaN and infinities become null and show as such (never as 0)."""
    return [[float(v) if math.isfinite(float(v)) else None for v in row] for row in grid]


def effects_payload(result: Any) -> dict[str, Any]:
    """The heatmap data of an Ablation (with each=True) or a Patching: one or more named grids."""
    d = result.to_dict()
    if "denoised" in d:
        names = ["denoised", "noised"]
        grids = {n: d[n] for n in names}
        title = f"{d['model']}: activation patching"
        if d.get("answer") is not None:
            title += f", logit difference {d['answer']!r} - {d['contrast']!r}"
    else:
        if d.get("grid") is None:
            raise ValueError("the ablation has no grid: run it with each=True")
        names = [d["primary"], *[n for n in d["grid"] if n != d["primary"] and n.startswith(("d_", "mean_"))]]
        grids = d["grid"]
        title = f"{d['model']}: {d['mode']} ablation of each head alone"
        if d.get("target") is not None:
            title += f", target {d['target']!r}"
    return {"title": title, "model": d["model"], "kind": d["kind"],
            "grids": [{"name": n, "label": LABELS.get(n, n), "values": _finite(grids[n])} for n in names]}


def effects_html(result: Any, trace: Trace | None = None) -> str:
    """A self-contained page: the heatmap, and (with the trace) the attention views a click opens."""
    return page_of(effects_payload(result), trace)


def grids_html(title: str, model: str, kind: str, grids: dict[str, Any], labels: dict[str, str],
               trace: Trace | None = None) -> str:
    """A heatmap page of any named [layer, head] grids (e.g. head importance)."""
    data = {"title": title, "model": model, "kind": kind,
            "grids": [{"name": n, "label": labels.get(n, n), "values": _finite(g)} for n, g in grids.items()]}
    return page_of(data, trace)


def page_of(data: dict[str, Any], trace: Trace | None) -> str:
    """The heatmap page of an effects payload; with the trace, its attention views below (a click opens a head)."""
    blocks: dict[str, Any] = {DATA_EFFECTS: data}
    if trace is not None:
        from attnscope.views.payload import payload

        initial = {"view": "all", "layer": 0, "head": 0, "query": None, "source": None, "theme": "auto",
                   "heads": None}
        blocks["attnscope-data"] = payload(trace, None, None, "budget", initial=initial)
    return standalone(data["title"], view_script("effects.js", BOOT), css() + "\n" + STYLE,
                      [ROOT_EFFECTS, "attnscope-root"], blocks)


def effects_page(result: Any, trace: Trace | None = None) -> Any:
    """The page as an HTMLPage: shows itself in Jupyter, .save(path) writes it."""
    from attnscope.views import HTMLPage

    return HTMLPage(effects_html(result, trace), height=760 if trace is not None else 420)


def effects_figure(result: Any, path: str | os.PathLike[str], fmt: str | None = None, scale: float = 2.0) -> Path:
    """The effect grids as a figure (svg, png or pdf, from fmt or the file's suffix): a cell per layer and head,
    each value as text, NaN as NaN (the page's ⤓ SVG button, drawn in headless Chromium)."""
    from attnscope.views.figures import MAX_SCALE, figure_format, render_figure

    kind = figure_format(path, fmt)
    if not 0 < scale <= MAX_SCALE:
        raise AttnscopeError(f"scale must be above 0 and at most {MAX_SCALE:g}, got {scale:g}")
    return render_figure(page_of(effects_payload(result), None), Path(path), kind, scale,
                         root=ROOT_EFFECTS)
