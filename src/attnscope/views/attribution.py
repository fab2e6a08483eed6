"""An Attribution as a view: a token heatmap per method (and per target), each method's check and unit beside its
row, a click on a token for its score and rank under every method, and the methods' rank agreement (Spearman).

Python builds a JSON payload (`attribution_payload`); assets/attribution.js draws it
(`window.attnscope.renderAttribution(element, data)`). The page is self-contained (CSS and JS inlined, a CSP by
hash, nothing fetched), shows itself in Jupyter (`attribution_page(a)`), and is drawn as SVG, PNG or PDF by
headless Chromium (`attribution_figure`). Torch-free: a saved attribution renders without torch.

Ranks: 1 is the token with the highest score under a method (the most positive for a signed score); tied scores
share their average rank, as scipy.stats.rankdata does. Spearman's rho between methods is the record's
(Attribution.rank_agreement, equal to scipy.stats.spearmanr). Tokens and targets are 0-indexed.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attnscope.errors import AttnscopeError
from attnscope.numbers import finite_or_null
from attnscope.views.page import css, standalone, view_script
from attnscope.views.payload import token_texts

if TYPE_CHECKING:
    from attnscope.attribution.record import Attribution, MethodScores
    from attnscope.views import HTMLPage

FORMAT = "attnscope.attribution/1"
ROOT = "attnscope-root"  # the element the page draws into (render_figure's and the tests' default)
DATA = "attnscope-attribution"  # the id of the payload's <script type="application/json"> block
BOOT = "\nwindow.attnscope.bootAttribution();\n"
COLOURS = ("method", "shared")  # each method's row on its own scale, or every row on one
# Methods whose scores carry a sign (drawn diverging around 0); any method with a negative score is drawn so too.
SIGNED = frozenset({"input_x_gradient", "integrated_gradients", "leave_one_out", "leave_one_out_replaced",
                    "attention_x_gradient"})
STYLE = """
.as-attr { font: 14px system-ui, sans-serif; margin: 12px; color: #111; }
.as-attr h2 { font-size: 17px; margin: 4px 0; }
.as-attr h3 { font-size: 15px; margin: 14px 0 6px; }
.as-attr-note { color: #555; margin: 4px 0 10px; }
.as-attr-scroll { overflow-x: auto; max-width: 100%; }
.as-attr-heat, .as-attr-rho, .as-attr-tok { border-collapse: collapse; }
.as-attr-heat th, .as-attr-heat td { padding: 1px; text-align: left; vertical-align: middle; }
.as-attr-heat th.as-attr-method { position: sticky; left: 0; background: #fff; padding-right: 8px;
  font-weight: 500; white-space: nowrap; }
.as-attr-unit { color: #555; font-size: 12px; white-space: nowrap; padding-left: 8px !important; }
.as-attr-cell { border: 1px solid transparent; padding: 3px 5px; font: 13px ui-monospace, monospace;
  white-space: pre; cursor: pointer; min-width: 20px; }
.as-attr-cell.as-attr-picked { border-color: #111; outline: 1px solid #111; }
.as-attr-cell:focus-visible, .as-attr-cell:hover { outline: 2px solid #333; }
.as-attr-idx { color: #777; font: 11px ui-monospace, monospace; text-align: center !important; }
.as-attr-parts th { color: #555; font-weight: 500; font-size: 12px; border-bottom: 1px solid #bbb; }
.as-attr-badge { display: inline-block; font-size: 11px; padding: 0 5px; border-radius: 3px; margin-left: 6px;
  color: #fff; }
.as-attr-badge[data-status="PASS"] { background: #2e7d32; }
.as-attr-badge[data-status="FAIL"] { background: #c62828; }
.as-attr-badge[data-status="NOT VERIFIED"] { background: #8d6e00; }
.as-attr-toggle button { font: inherit; padding: 2px 10px; }
.as-attr-toggle button[aria-pressed="true"] { background: #333; color: #fff; }
.as-attr-tok th, .as-attr-tok td, .as-attr-rho th, .as-attr-rho td { padding: 2px 8px; text-align: left; }
.as-attr-tok td.num, .as-attr-rho td { font: 12px ui-monospace, monospace; text-align: right; }
.as-attr-checks li { margin: 2px 0; }
"""


def average_ranks(row: np.ndarray) -> np.ndarray:
    """[token] scores -> [token] ranks, 1 for the highest; ties share their average rank (scipy.stats.rankdata
    of -row, method "average"). NaN scores get NaN ranks and the others are ranked among themselves."""
    ranks = np.full(row.shape, np.nan)
    finite = np.isfinite(row)
    values = -row[finite]
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    # each run of equal values [start, end) gets the mean of the 1-based positions start+1 .. end
    edges = np.flatnonzero(np.diff(sorted_values) != 0) + 1
    starts, ends = np.r_[0, edges], np.r_[edges, len(values)]
    averaged = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    kept = np.empty(len(values))
    kept[order] = averaged
    ranks[finite] = kept
    return ranks


def spearman_matrix(attr: Attribution, target: int = 0) -> list[list[float | None]]:
    """[method, method] Spearman's rho between the methods' scores of one target (0-indexed), in the
    Attribution's method order (the record's rank_agreement); None where rho is not defined (a row with a NaN
    score, or whose scores are all equal)."""
    rho = attr.rank_agreement(target)  # float64 [method, method], NaN where not defined
    return [[float(r) if math.isfinite(r) else None for r in row] for row in rho.tolist()]


def _agreement_note(attr: Attribution, target: int) -> str | None:
    """Why some of a target's correlations are missing, or None."""
    whys = []
    for name, ms in attr.methods.items():
        row = ms.scores[target]
        if not np.isfinite(row).all():
            whys.append(f"{name} has a score that is not a number")
        elif len(row) > 1 and np.ptp(row) == 0:
            whys.append(f"{name} gives every token the same score")
    return "; ".join(whys) + ": its rank correlation is not defined" if whys else None


def _numbers(array: np.ndarray) -> list[Any]:
    """float64 [target, token] as JSON numbers (exact: Python floats round-trip), NaN and infinities as null."""
    return [[float(v) if math.isfinite(v) else None for v in row] for row in array.tolist()]


def _method_payload(name: str, ms: MethodScores) -> dict[str, Any]:
    scores = np.asarray(ms.scores, dtype=np.float64)  # [target, token]
    finite = scores[np.isfinite(scores)]
    signed = name in SIGNED or bool((finite < 0).any())
    return {
        "name": name,
        "unit": ms.unit,
        "signed": signed,
        "scores": _numbers(scores),  # [target][token]
        "ranks": _numbers(np.stack([average_ranks(row) for row in scores])) if scores.size else [],
        "top": float(np.abs(finite).max()) if finite.size else 0.0,  # the largest |score|: where colours end
        "check": finite_or_null(ms.check.to_dict()),
        "cost": finite_or_null(ms.cost.to_dict()),
        "settings": finite_or_null(_plain(ms.settings)),
    }


def _plain(settings: dict[str, Any]) -> dict[str, Any]:
    """Settings as JSON values: numbers, strings, booleans and None as they are, anything else as its str()."""
    out: dict[str, Any] = {}
    for key, v in settings.items():
        out[str(key)] = v if isinstance(v, str | int | float | bool) or v is None else str(v)
    return out


def attribution_payload(attr: Attribution, colours: str = "method", raw_tokens: bool = False) -> dict[str, Any]:
    """A JSON-serialisable description of an Attribution that `window.attnscope.renderAttribution` draws.

    colours: "method" (each method's rows coloured up to its own largest |score|) or "shared" (every row up to
    the largest |score| of all), the page's starting choice. raw_tokens: tokens as the tokenizer spells its
    pieces ("Ġworld") rather than as they read (" world")."""
    if colours not in COLOURS:
        raise AttnscopeError(f"colours={colours!r} is not known: use {' or '.join(COLOURS)}", parameter="colours")
    _validate(attr)

    return {
        "format": FORMAT,
        "title": f"{attr.model} ({attr.architecture}): {attr.description}",
        "model": attr.model,
        "architecture": attr.architecture,
        "kind": attr.kind,
        "description": attr.description,
        "status": attr.status,
        "tokens": token_texts(attr.tokens, raw_tokens),
        "special": [bool(t.special) for t in attr.tokens],
        "segments": [int(t.segment) for t in attr.tokens],
        "raw_tokens": raw_tokens,
        "targets": list(attr.targets),
        "methods": [_method_payload(name, ms) for name, ms in attr.methods.items()],
        "agreement": [{"target": t, "rho": spearman_matrix(attr, t), "note": _agreement_note(attr, t)}
                      for t in range(len(attr.targets))],
        "skipped": dict(attr.skipped),  # methods left out -> why (not named, or not applying to the model)
        "colours": colours,
    }


def _validate(attr: Attribution) -> None:
    """Every method's scores are [target, token] of this attribution's sizes (else the page would mislabel)."""
    want = (len(attr.targets), len(attr.tokens))
    for name, ms in attr.methods.items():
        if tuple(np.shape(ms.scores)) != want:
            raise AttnscopeError(f"{name}'s scores are {tuple(np.shape(ms.scores))}, not [target, token] = {want}")
    if not attr.methods:
        raise AttnscopeError("the attribution has no methods to show: run attribute() with at least one method")


def page_html(data: dict[str, Any], title: str) -> str:
    """A complete page drawing one attribution payload (CSS and JS inlined, the CSP allowing only its script)."""
    return standalone(title, view_script("attribution.js", BOOT), css() + "\n" + STYLE, [ROOT], {DATA: data})


def attribution_html(attr: Attribution, colours: str = "method", raw_tokens: bool = False) -> str:
    """The attribution as a self-contained HTML page (file://, no network)."""
    data = attribution_payload(attr, colours, raw_tokens)
    return page_html(data, f"attnscope attribution: {data['title']}")


def frame_height(attr: Attribution) -> int:
    """A first height for a notebook frame: the heatmaps, the token table and the agreement, within 360-900 px."""
    n = len(attr.methods)
    need = 160 + len(attr.targets) * (60 + 30 * n + 28 * (n + 2)) + 28 * (n + 2) + 22 * n
    return max(360, min(900, need))


def attribution_page(attr: Attribution, colours: str = "method", raw_tokens: bool = False) -> HTMLPage:
    """The page as an HTMLPage: shows itself in Jupyter (an isolated iframe), .save(path) writes it."""
    from attnscope.views import HTMLPage

    return HTMLPage(attribution_html(attr, colours, raw_tokens), height=frame_height(attr))


def save_attribution_html(attr: Attribution, path: str | os.PathLike[str], colours: str = "method",
                          raw_tokens: bool = False) -> Path:
    """Write the page to `path` (the CLI's --html FILE) and return the path."""
    return attribution_page(attr, colours, raw_tokens).save(path)


def attribution_figure(attr: Attribution, path: str | os.PathLike[str], fmt: str | None = None, scale: float = 2.0,
                       *, colours: str = "method", caption: bool = True, raw_tokens: bool = False) -> Path:
    """The heatmaps and the rank agreement as a figure (svg, png or pdf, from fmt or the file's suffix), drawn by
    the page's own script in headless Chromium (as the page's ⤓ SVG button). scale: PNG pixels per SVG pixel;
    colours: "method" or "shared"; caption: False leaves out the lines naming the model, the objective and the
    scale."""
    from attnscope.views.figures import MAX_SCALE, figure_format, render_figure

    kind = figure_format(path, fmt)
    if not 0 < scale <= MAX_SCALE:
        raise AttnscopeError(f"scale must be above 0 and at most {MAX_SCALE:g}, got {scale:g}", parameter="scale")
    return render_figure(attribution_html(attr, colours, raw_tokens), Path(path), kind, scale, root=ROOT,
                         caption=caption)
