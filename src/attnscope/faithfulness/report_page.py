"""report.html of a faithfulness run (torch-free): one self-contained page, nothing fetched, no scripts.

The deletion and insertion curves (one line per method, its shaded 95% bootstrap band), the metrics table with
95% bootstrap intervals, and the methods' rank-agreement matrix (mean Spearman per example), drawn from
summary.json (faithfulness.aggregate). The curves are also written as deletion.svg and insertion.svg, and as
PNG through headless Chromium (views.raster).
"""

from __future__ import annotations

import html
import logging
import math
from pathlib import Path
from typing import Any

from attnscope.errors import AttnscopeError
from attnscope.faithfulness.metrics import BINS
from attnscope.views.report_style import CSS, document

log = logging.getLogger(__name__)
_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
            "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173")
_W, _H, _PAD = 520, 320, 44


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(v: Any, digits: int = 3) -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{digits}f}"


def curve_svg(summary: dict[str, Any], which: str) -> str:
    """An SVG of every method's mean `which` curve ("deletion" | "insertion") with its 95% bootstrap band."""
    methods = summary["methods"]
    ys = [y for e in methods.values() for key in ("low", "high") for y in e[which][key] if y is not None]
    lo, hi = (min(ys), max(ys)) if ys else (0.0, 1.0)
    hi = hi if hi > lo else lo + 1.0

    def pt(x: float, y: float) -> str:
        return f"{_PAD + x * (_W - 2 * _PAD):.1f},{_H - _PAD - (y - lo) / (hi - lo) * (_H - 2 * _PAD):.1f}"

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H + 18 * len(methods)}" '
             f'font-family="sans-serif" font-size="11"><title>{_e(which)} curves</title>',
             f'<rect x="{_PAD}" y="{_PAD}" width="{_W - 2 * _PAD}" height="{_H - 2 * _PAD}" fill="none" '
             'stroke="#999"/>',
             f'<text x="{_W / 2}" y="{_H - 10}" text-anchor="middle">fraction of the tokens '
             f'{"removed" if which == "deletion" else "kept"} (most important first)</text>',
             f'<text x="{_PAD}" y="{_PAD - 8}">{_e(_num(hi))}</text><text x="{_PAD}" y="{_H - _PAD + 14}">'
             f'{_e(_num(lo))}</text>']
    for i, (name, e) in enumerate(methods.items()):
        c, band = _COLOURS[i % len(_COLOURS)], e[which]
        xs = band["x"]
        upper = " ".join(pt(x, y) for x, y in zip(xs, band["high"], strict=True))
        lower = " ".join(pt(x, y) for x, y in zip(reversed(xs), reversed(band["low"]), strict=True))
        parts.append(f'<polygon points="{upper} {lower}" fill="{c}" fill-opacity="0.15" stroke="none"/>')
        line = " ".join(pt(x, y) for x, y in zip(xs, band["mean"], strict=True))
        parts.append(f'<polyline points="{line}" fill="none" stroke="{c}" stroke-width="1.6"/>')
        y = _H + 14 * i + 4
        parts.append(f'<rect x="{_PAD}" y="{y}" width="12" height="3" fill="{c}"/>'
                     f'<text x="{_PAD + 18}" y="{y + 5}">{_e(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _metrics_table(summary: dict[str, Any]) -> str:
    every = ["naopc", "aopc", "comprehensiveness_aopc", "sufficiency_aopc", *(f"comprehensiveness_{b}" for b in BINS),
             "deletion_area", "insertion_area", "spearman_loo", "kendall_loo"]
    cols = [c for c in every if c in next(iter(summary["methods"].values()))]  # metrics="agreement": the last two
    head = "".join(f"<th>{_e(_label(c))}</th>" for c in cols)
    body = []
    for name, e in summary["methods"].items():
        cells = "".join(f"<td>{_num(e[c]['mean'])}<br><small>[{_num(e[c]['low'])}, {_num(e[c]['high'])}]</small>"
                        f"</td>" for c in cols)
        body.append(f'<tr><td class="l">{_e(name)}</td>{cells}</tr>')
    return f'<table><thead><tr><th class="l">method</th>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _label(column: str) -> str:
    """naopc -> NAOPC, comprehensiveness_5 -> comp. 5%, sufficiency_aopc -> suff. AOPC, spearman_loo -> ..."""
    for long, short in (("comprehensiveness_", "comp. "), ("sufficiency_", "suff. "), ("_loo", " (LOO)")):
        column = column.replace(long, short)
    column = column.replace("naopc", "NAOPC").replace("aopc", "AOPC").replace("_", " ")
    return column + "%" if column[-1].isdigit() else column


def _agreement_table(summary: dict[str, Any]) -> str:
    names, matrix = summary["agreement"]["methods"], summary["agreement"]["matrix"]
    head = "".join(f"<th>{_e(n)}</th>" for n in names)
    rows = []
    for name, row in zip(names, matrix, strict=True):
        cells = []
        for v in row:
            shade = "" if v is None else f' style="background: rgba(31,119,180,{max(0.0, v) * 0.6:.2f})"'
            cells.append(f"<td{shade}>{_num(v, 2)}</td>")
        rows.append(f'<tr><td class="l">{_e(name)}</td>{"".join(cells)}</tr>')
    return f'<table><thead><tr><th></th>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def has_curves(summary: dict[str, Any]) -> bool:
    """Whether the run measured curves (not a run of metrics="agreement")."""
    return all("deletion" in e for e in summary["methods"].values())


def _curves(summary: dict[str, Any]) -> str:
    if not has_curves(summary):
        return ('<p class="note">Only the rank agreement with leave-one-out was measured (metrics: agreement): no '
                "curves, ERASER or AOPC.</p>")
    return ('<h2>Deletion and insertion curves</h2><p class="note">Mean over examples, shaded: 95% bootstrap '
            'band. Deletion: lower is more faithful; insertion: higher.</p><div class="grid">'
            f"{curve_svg(summary, 'deletion')}{curve_svg(summary, 'insertion')}</div>")


def report_html(summary: dict[str, Any]) -> str:
    """The page (summary: faithfulness's summary.json, NaN as null)."""
    s, src = summary, summary["source"]
    what = (f"{s['examples']:,} examples of {_e(src['spec'])} ({s['skipped']:,} too short, {src['malformed']:,} "
            f"malformed rows skipped) on {_e(s['model'])}. Removal: <b>{_e(s['removal'])}</b>, the same for every "
            "method; special tokens are never removed. The unperturbed input scored beside the modified ones "
            f"differs from the model's own forward by at most {s['unperturbed_error_max']:.1e}. "
            + (f"Normalised AOPC bounds: {_e(', '.join(s['naopc_bounds']))} (docs/faithfulness.md)."
               if s["naopc_bounds"] else ""))
    return document("attnscope faithfulness", CSS,
                    f"<h1>Faithfulness of attribution methods</h1><p>{what}</p>{_curves(s)}"
                    '<h2>Metrics</h2><p class="note">Mean over examples [95% bootstrap interval].</p>'
                    f"{_metrics_table(s)}"
                    '<h2>Rank agreement</h2><p class="note">Mean Spearman rho per example between the methods\' '
                    f"scores of the removable tokens.</p>{_agreement_table(s)}")


def write_report(summary: dict[str, Any], outdir: Path, png: bool = True) -> list[Path]:
    """report.html and, when the run measured curves, deletion.svg and insertion.svg in outdir, and with png
    deletion.png and insertion.png (2 pixels per SVG pixel; skipped with a warning without a browser)."""
    paths = [outdir / "report.html"]
    paths[0].write_text(report_html(summary), encoding="utf-8")
    svgs = [(curve_svg(summary, which), outdir / f"{which}.svg") for which in ("deletion", "insertion")
            if has_curves(summary)]
    for svg, path in svgs:
        path.write_text(svg, encoding="utf-8")
        paths.append(path)
    if png and svgs:
        paths += _pngs(svgs)
    return paths


def _pngs(svgs: list[tuple[str, Path]]) -> list[Path]:
    from attnscope.views.raster import svgs_to_png

    try:
        return svgs_to_png([(svg, path.with_suffix(".png")) for svg, path in svgs])
    except AttnscopeError as exc:  # no Playwright or no Chromium: the SVGs are written, the run is not lost
        log.warning("the PNG figures were not written (%s); the SVGs are", exc)
        return []
