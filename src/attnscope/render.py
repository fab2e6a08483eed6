"""Turn walkthroughs and check reports into terminal text (rich), Markdown or JSON-able dicts."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from attnscope.explain import Step, Walkthrough
from attnscope.report import CheckReport

MAX_ROWS = 12
MAX_COLS = 8
ELLIPSIS = "…"


def _keep(n: int, limit: int) -> list[int | None]:
    """Indices to show of an axis of length n; None marks the elided middle."""
    if n <= limit:
        return list(range(n))
    head = limit - 2
    return [*range(head), None, n - 2, n - 1]


def _fmt(v: float, integers: bool) -> str:
    if v <= np.finfo(np.float32).min / 2:
        return "-inf*"  # the additive mask's most negative float32
    return str(int(v)) if integers else f"{v:.4f}"


def _grid(arr: np.ndarray, rows: list[str] | None, cols: list[str] | None,
          max_rows: int, max_cols: int) -> tuple[list[str], list[list[str]]]:
    """Header and body cells of a 2-D array with the elision visible."""
    a = np.atleast_2d(arr)
    ri, ci = _keep(a.shape[0], max_rows), _keep(a.shape[1], max_cols)
    finite = a[np.isfinite(a)]
    integers = bool(np.all(finite == np.round(finite)) and np.all(np.abs(finite) < 1e6))
    header = [""] + [ELLIPSIS if j is None else (cols[j][:9] if cols else str(j)) for j in ci]
    body = []
    for i in ri:
        label = ELLIPSIS if i is None else (rows[i] if rows and i < len(rows) else str(i))
        label = label if len(label) <= 14 else label[:13] + ELLIPSIS
        cells = [ELLIPSIS if i is None or j is None else _fmt(float(a[i, j]), integers) for j in ci]
        body.append([label, *cells])
    return header, body


def matrix_table(name: str, arr: np.ndarray, rows: list[str] | None = None, cols: list[str] | None = None,
                 max_rows: int = MAX_ROWS, max_cols: int = MAX_COLS) -> Table:
    a = np.atleast_2d(arr)
    header, body = _grid(a, rows, cols, max_rows, max_cols)
    t = Table(title=f"{name} {list(a.shape)}", title_justify="left", show_edge=False, pad_edge=False)
    for h in header:
        t.add_column(h, justify="right", no_wrap=True, min_width=max(len(h), 6))
    for r in body:
        t.add_row(*r)
    return t


def columns_for_width(width: int) -> int:
    """How many matrix columns fit a terminal of this width (label column plus ~9 per number)."""
    return max(4, min(MAX_COLS, (width - 16) // 9))


def walkthrough_renderables(w: Walkthrough, max_rows: int = MAX_ROWS, max_cols: int = MAX_COLS) -> list[RenderableType]:
    """The walkthrough for a terminal."""
    out: list[RenderableType] = [Text(_header(w), style="bold")]
    for n, step in enumerate(w.steps, 1):
        parts: list[RenderableType] = [Text(f"\n{n}. {step.title}  ({step.stage})", style="bold cyan")]
        if step.text:
            parts.append(Text(step.text))
        if step.shape:
            parts.append(Text(f"shape {step.shape}", style="dim"))
        for name, arr in step.arrays.items():
            rows = step.row_labels if np.atleast_2d(arr).shape[0] == len(step.row_labels or []) else None
            parts.append(matrix_table(name, arr, rows, _cols(step, arr), max_rows, max_cols))
        out.append(Group(*parts))
    if w.check:
        out.append(Text("\n" + check_line(w), style="bold green" if w.check.get("ok") else "bold red"))
    return out


def _cols(step: Step, arr: np.ndarray) -> list[str] | None:
    a = np.atleast_2d(arr)
    return step.col_labels if step.col_labels and a.shape[1] == len(step.col_labels) else None


def _header(w: Walkthrough) -> str:
    name = w.model.get("name", "?")
    if w.model.get("name") == "toy example":
        return "Self-attention by hand: the 3-input toy example"
    focus = "" if w.token is None else f", query token {w.token}"
    return (f"{name}: layer {w.layer}, head {w.head}{focus} (0-indexed; "
            f"{w.model.get('layers')} layers x {w.model.get('heads')} heads)")


def check_line(w: Walkthrough) -> str:
    c = w.check
    if c.get("unsupported"):
        return f"check: {c['unsupported']}; captured numbers shown as the model produced them"
    verdict = "OK" if c.get("ok") else "FAILED"
    return (f"check: {verdict}: every stage of layer {w.layer} head {w.head} recomputed from the layer's "
            f"weights matches the model's forward pass: max abs error {c.get('head_max_error', 0):.2e} "
            f"(tolerance {c.get('tolerance', 0):.0e})")


def walkthrough_markdown(w: Walkthrough, max_rows: int = MAX_ROWS, max_cols: int = MAX_COLS) -> str:
    lines = [f"# {_header(w)}", ""]
    for n, step in enumerate(w.steps, 1):
        lines += [f"## {n}. {step.title} (`{step.stage}`)", ""]
        if step.text:
            lines += [step.text, ""]
        if step.shape:
            lines += [f"Shape: `{step.shape}`", ""]
        for name, arr in step.arrays.items():
            rows = step.row_labels if np.atleast_2d(arr).shape[0] == len(step.row_labels or []) else None
            header, body = _grid(arr, rows, _cols(step, arr), max_rows, max_cols)
            lines += [f"`{name}` {list(np.atleast_2d(arr).shape)}", "", _md_row(header),
                      _md_row(["---"] * len(header)), *(_md_row(r) for r in body), ""]
    if w.check:
        lines += [f"**{check_line(w)}**", ""]
    return "\n".join(lines)


def _md_row(cells: list[str]) -> str:
    esc = [c.replace("|", "\\|") for c in cells]
    return "| " + " | ".join(esc) + " |"


def walkthrough_json(w: Walkthrough) -> dict[str, Any]:
    """Every step's full array under its stage name."""
    return {
        "model": w.model, "layer": w.layer, "head": w.head, "token": w.token, "tokens": w.tokens,
        "steps": [
            {"stage": s.stage, "title": s.title, "text": s.text, "shape": s.shape,
             "row_labels": s.row_labels, "col_labels": s.col_labels,
             "arrays": {k: _json_array(v) for k, v in s.arrays.items()}}
            for s in w.steps
        ],
        "check": w.check,
    }


def _json_array(arr: np.ndarray) -> Any:
    """Nested lists; float32 values in their shortest exact form (0.1, not 0.10000000149011612)."""
    a = np.asarray(arr)
    if a.dtype == np.float32:
        return a.astype(str).astype(np.float64).tolist()  # each string parses back to the same float32
    return a.tolist()


def check_table(report: CheckReport, n_layers: int) -> Table:
    """Rows: each stage compared with the recompute or the model; columns: layers (0-indexed), max over heads."""
    t = Table(title="max error per layer (over heads): captured vs recompute and vs the model's own outputs",
              title_justify="left")
    t.add_column("stage", no_wrap=True)
    t.add_column("vs", no_wrap=True)
    for layer in range(n_layers):
        t.add_column(f"L{layer}", justify="right", no_wrap=True)
    for c in report.comparisons:
        name = f"{c.stage} (rel)" if c.relative else c.stage
        t.add_row(name, c.source, *(_err(float(c.errors[layer].max()), report.tolerance) for layer in range(n_layers)))
    return t


def _err(e: float, tol: float) -> str:
    style = "green" if e <= tol else "bold red"
    return f"[{style}]{e:.0e}[/{style}]"


def check_summary(report: CheckReport) -> str:
    if not report.comparisons and report.unsupported:
        return f"not verified: {report.unsupported}"
    verdict = "PASS" if report.ok else "FAIL"
    extra = f"; {report.unsupported}" if report.unsupported else ""
    return (f"{verdict}: max error {report.max_error:.2e} over {len(report.comparisons)} comparisons "
            f"(tolerance {report.tolerance:.0e}){extra}")


def check_markdown(report: CheckReport, n_layers: int) -> str:
    heads = ["layer", *(f"{c.stage} ({c.source})" for c in report.comparisons)]
    rows = [[str(i), *(f"{float(c.errors[i].max()):.1e}" for c in report.comparisons)] for i in range(n_layers)]
    return "\n".join([_md_row(heads), _md_row(["---"] * len(heads)), *map(_md_row, rows), "",
                      check_summary(report), ""])


def to_text(renderables: list[RenderableType], width: int = 120) -> str:
    """Render rich objects to plain text (for files and tests)."""
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, highlight=False).print(*renderables)
    return buf.getvalue()
