"""report.html and the terminal summary of a stats run: one self-contained page (inline CSS, images as data: URLs,
nothing fetched)."""

from __future__ import annotations

import base64
import html
from typing import Any

from attnscope.views.report_style import CSS, FIGURES_CSS, document


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _table(header: list[str], rows: list[list[Any]], left: int = 0) -> str:
    """An escaped HTML table; the first `left` columns are left-aligned."""
    def cell(tag: str, i: int, v: Any) -> str:
        cls = ' class="l"' if i < left else ""
        return f"<{tag}{cls}>{_e(v)}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(r)) + "</tr>" for r in rows)
    thead = f"<thead><tr>{head}</tr></thead>" if any(header) else ""
    return f"<table>{thead}<tbody>{body}</tbody></table>"


def _overview(info: dict[str, Any]) -> str:
    model, source, run = info["model"], info["source"], info.get("run", {})
    rows = [
        ["model", f"{model['name']} ({model['architecture']}, {model['layers']} layers x {model['heads']} heads"
                  f"{', causal' if model.get('causal') else ''})"],
        ["source", f"{source.get('spec')} ({source.get('kind')})"],
        ["documents", f"{info['documents']:,}"],
        ["tokens", f"{info['tokens']:,}"],
        ["truncated documents", f"{info['truncated']:,}"],
        ["malformed rows skipped", f"{source.get('malformed', 0):,}"],
        ["settings", ", ".join(f"{k}={v}" for k, v in info.get("settings", {}).items())],
        ["tokens / s", f"{run.get('tokens_per_second', float('nan')):,.0f}"],
    ]
    return _table(["", ""], rows, left=2)


def _heatmaps(info: dict[str, Any], images: dict[str, bytes]) -> str:
    figures = []
    for name, png in images.items():
        data = base64.b64encode(png).decode("ascii")
        caption = info["metrics"].get(name, name)
        figures.append(f'<figure><img alt="{_e(name)} heatmap" src="data:image/png;base64,{data}">'
                       f"<figcaption>{_e(name)}: {_e(caption)}</figcaption></figure>")
    return '<div class="grid">' + "".join(figures) + "</div>"


def _classes(info: dict[str, Any], heads: list[dict[str, Any]]) -> str:
    columns = [c for c in ("prev", "next", "cls", "sep", "sink", "punct", "entropy", "entropy_uniform")
               if f"{c}_mean" in (heads[0] if heads else {})]
    rows = [[r["layer"], r["head"], r["classes"] or "-", *(f"{r[f'{c}_mean']:.3f}" for c in columns)]
            for r in heads if r["classes"]]
    rules = "; ".join(f"{k}: {v}" for k, v in info["thresholds"].items())
    if not rows:
        return f'<p class="note">No head passes a class threshold ({_e(rules)}).</p>'
    return (f'<p class="note">Thresholds on the corpus means: {_e(rules)}.</p>'
            + _table(["layer", "head", "classes", *columns], rows))


def _syntax(info: dict[str, Any]) -> str:
    syntax = info.get("syntax")
    if not syntax:
        return ""
    rows = [[r["relation"], r["count"], f"{100 * r['accuracy']:.1f}", f"{r['layer']}-{r['head']}", r["direction"],
             f"{r['baseline_offset']:+d}", f"{100 * r['baseline_accuracy']:.1f}"] for r in syntax["best_heads"]]
    note = ('<p class="note">For each gold relation, the head whose most-attended word (excluding itself, '
            "[CLS] and [SEP]) is the gold head most often, in either direction, next to the best fixed "
            "offset (Clark et al. 2019, Table 1). Root words are not scored; "
            f"{_e(syntax['unscored_words'])} words were lost to truncation.</p>")
    return ("<h2>Dependency syntax</h2>" + note
            + _table(["relation", "count", "best head %", "layer-head", "direction", "offset", "offset %"], rows,
                     left=1))


def report_html(info: dict[str, Any], heads: list[dict[str, Any]], images: dict[str, bytes]) -> str:
    """The whole page; every value that came from the user or the corpus is escaped."""
    title = f"attnscope stats: {info['model']['name']} on {info['source'].get('spec')}"
    return document(title, CSS + FIGURES_CSS,
                    f"<h1>{_e(title)}</h1>"
                    f'<p class="note">{_e(info["indexing"])}. Each document counts equally: every figure is the mean '
                    "over documents of a per-document value (see docs/stats.md).</p>"
                    + _overview(info)
                    + "<h2>Heatmaps (layer x head)</h2>" + _heatmaps(info, images)
                    + "<h2>Head classes</h2>" + _classes(info, heads)
                    + _syntax(info))


def report_text(info: dict[str, Any], heads: list[dict[str, Any]], most: int = 8) -> str:
    """The terminal summary of a run: each head class with its heads (strongest first) and, for CoNLL-U,
    the best head of the most frequent relations. Names are printed as they are (a terminal runs no HTML)."""
    from attnscope.stats.metrics import BROAD_RATIO, CLASS_RULES

    lines = [f"Head classes ({info['indexing']}; layer-head and its corpus mean):"]
    rules = {name: metric for name, metric, _ in CLASS_RULES}
    for name in ("broad", *rules):
        members = [r for r in heads if name in r["classes"].split()]
        if not members:
            continue
        if name == "broad":  # how close to uniform: entropy / its uniform baseline
            scored = [(r, r["entropy_mean"] / r["entropy_uniform_mean"]) for r in members]
            label = f"broad (entropy > {BROAD_RATIO} x uniform)"
        else:
            scored = [(r, r[f"{rules[name]}_mean"]) for r in members]
            label = f"{name} ({info['thresholds'][name]})"
        scored.sort(key=lambda rv: -rv[1])
        shown = "  ".join(f"{r['layer']}-{r['head']} {v:.2f}" for r, v in scored[:most])
        more = f"  (+{len(scored) - most} more)" if len(scored) > most else ""
        lines.append(f"  {label:<36} {len(scored):>3}: {shown}{more}")
    if len(lines) == 1:
        lines.append("  no head passes a class threshold")
    syntax = info.get("syntax")
    if syntax and syntax["best_heads"]:
        rows = syntax["best_heads"][:most]
        lines.append(f"Dependency syntax, best head per relation (the {len(rows)} most frequent of "
                     f"{len(syntax['best_heads'])}; Clark et al. Table 1):")
        lines.append(f"  {'relation':<12} {'count':>6}  {'head':>5} {'accuracy':>8}  {'direction':<9}  best offset")
        for r in rows:
            lines.append(f"  {r['relation']:<12} {r['count']:>6}  {r['layer']:>3}-{r['head']:<2} "
                         f"{100 * r['accuracy']:>7.1f}%  {r['direction']:<9}  {r['baseline_offset']:+d} "
                         f"{100 * r['baseline_accuracy']:.1f}%")
    return "\n".join(lines)
