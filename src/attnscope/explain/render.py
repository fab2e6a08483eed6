"""Turn walkthroughs and check reports into terminal text (rich), Markdown or JSON-able dicts.

Nothing is cut silently: a table that does not fit the width is split into column blocks
(`full=True`) or shows its first and last columns with a line naming the ones left out.
Numbers follow `attnscope.numbers` (4 decimals; errors as 5.4e-07).
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from attnscope.explain.steps import Step, Walkthrough
from attnscope.numbers import error, value
from attnscope.records.check_report import CheckReport, Comparison
from attnscope.stages import ATTENTION_LABELS

MAX_ROWS = 12  # rows shown of a long matrix unless full
MD_COLS = 8  # columns shown in Markdown unless full
ELLIPSIS = "…"
GAP = 3  # a rich table's " │ " between columns
F32_MIN = float(np.finfo(np.float32).min)
MIN_NOTE = "-inf* is the most negative float32 (-3.4028e+38): the mask's stand-in for -inf."
REL_NOTE = ("(rel): scores are compared relative to their float32 rounding bound, |a - b| / max(1, |q| |k|), and "
            "the output likewise, / max(1, |merged| |W_O column|); every other stage in absolute terms.")


def _fmt(v: float, integers: bool) -> str:
    if v <= F32_MIN / 2 and np.isfinite(v):
        return "-inf*"
    return str(int(v)) if integers and np.isfinite(v) else value(v)


def _has_min(arr: np.ndarray) -> bool:
    """Whether an array holds the mask's stand-in for -inf (shown -inf*)."""
    a = np.asarray(arr)
    return bool(a.dtype.kind == "f" and np.any(np.isfinite(a) & (a <= F32_MIN / 2)))


def _keep(n: int, limit: int) -> list[int | None]:
    """Indices to show of an axis of length n; None marks the elided middle."""
    if n <= limit:
        return list(range(n))
    return [*range(limit - 2), None, n - 2, n - 1]


def _elided(kind: str, idx: list[int | None], n: int) -> str | None:
    """'rows 10..381 of 384 not shown' for the gap in idx, or None."""
    if None not in idx:
        return None
    at = idx.index(None)
    first = 0 if at == 0 else int(idx[at - 1]) + 1  # type: ignore[arg-type]
    last = int(idx[at + 1]) - 1  # type: ignore[arg-type]
    return f"{kind} {first}..{last} of {n} not shown (0-indexed)"


class Cells:
    """Every formatted cell of a 2-D array with its row and column labels (nothing truncated)."""

    def __init__(self, arr: np.ndarray, rows: list[str] | None, cols: list[str] | None,
                 integer_cols: tuple[str, ...] = ()) -> None:
        a = np.atleast_2d(arr)
        finite = a[np.isfinite(a) & (a > F32_MIN / 2)]  # the mask's stand-in for -inf is not a number to show
        integers = bool(np.all(finite == np.round(finite)) and np.all(np.abs(finite) < 1e6))
        self.array, self.shape = a, a.shape
        self.rows = rows if rows and len(rows) == a.shape[0] else [str(i) for i in range(a.shape[0])]
        self.cols = cols if cols and len(cols) == a.shape[1] else [str(j) for j in range(a.shape[1])]
        self.integers = [integers or c in integer_cols for c in self.cols]  # per column: indices, positions
        self._text: dict[int, list[str]] = {}  # formatted rows, made when first shown

    def row(self, i: int) -> list[str]:
        if i not in self._text:
            self._text[i] = [_fmt(float(x), whole) for x, whole in zip(self.array[i], self.integers, strict=True)]
        return self._text[i]

    def col_width(self, j: int, rows: list[int | None]) -> int:
        return max([len(self.cols[j]), *(len(self.row(i)[j]) for i in rows if i is not None)])

    def label_width(self, rows: list[int | None]) -> int:
        return max([1, *(len(self.rows[i]) for i in rows if i is not None)])


def _fit(cells: Cells, rows: list[int | None], width: int) -> list[int | None]:
    """The columns to show in `width` characters: all, or the first ones and the last two around a gap."""
    n = cells.shape[1]
    avail = width - cells.label_width(rows)
    widths = [cells.col_width(j, rows) + GAP for j in range(n)]
    if sum(widths) <= avail:
        return list(range(n))
    tail = [j for j in (n - 2, n - 1) if j >= 0]
    room = avail - sum(widths[j] for j in tail) - (len(ELLIPSIS) + GAP)
    head: list[int] = []
    for j in range(n - len(tail)):
        if room < widths[j]:
            break
        head.append(j)
        room -= widths[j]
    return [*head, None, *tail]


def _blocks(cells: Cells, rows: list[int | None], width: int) -> list[list[int | None]]:
    """Every column, in blocks that each fit `width` characters (at least one column per block)."""
    avail = width - cells.label_width(rows)
    blocks: list[list[int | None]] = [[]]
    used = 0
    for j in range(cells.shape[1]):
        w = cells.col_width(j, rows) + GAP
        if blocks[-1] and used + w > avail:
            blocks.append([])
            used = 0
        blocks[-1].append(j)
        used += w
    return blocks


def _table(title: str, cells: Cells, rows: list[int | None], cols: list[int | None]) -> Table:
    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False, min_width=len(title))
    t.add_column("", justify="left", overflow="fold")
    for j in cols:
        head = ELLIPSIS if j is None else cells.cols[j]
        t.add_column(head, justify="right", overflow="fold", min_width=len(head))
    for i in rows:
        label = ELLIPSIS if i is None else cells.rows[i]
        t.add_row(label, *(ELLIPSIS if i is None or j is None else cells.row(i)[j] for j in cols))
    return t


def matrix_renderables(name: str, arr: np.ndarray, rows: list[str] | None = None, cols: list[str] | None = None,
                       width: int = 120, full: bool = False,
                       integer_cols: tuple[str, ...] = ()) -> list[RenderableType]:
    """One array as tables that fit `width`: every row and column when full, else a visible, named elision."""
    cells = Cells(arr, rows, cols, integer_cols)
    n_rows, n_cols = cells.shape
    shown: list[int | None] = list(range(n_rows)) if full else _keep(n_rows, MAX_ROWS)
    title = f"{name} {list(cells.shape)}"
    if full:
        blocks = _blocks(cells, shown, width)
        if len(blocks) == 1:
            return [_table(title, cells, shown, blocks[0])]
        return [_table(f"{title}, columns {b[0]}..{b[-1]}", cells, shown, b) for b in blocks]
    cols_shown = _fit(cells, shown, width)
    out: list[RenderableType] = [_table(title, cells, shown, cols_shown)]
    notes = [n for n in (_elided("rows", shown, n_rows), _elided("columns", cols_shown, n_cols)) if n]
    if notes:
        out.append(Text(f"{'; '.join(notes)}: `attnscope explain --full` prints them all", style="dim"))
    return out


def _step_heading(n: int, step: Step) -> str:
    return f"{step.number or n}. {step.title}  ({step.stage})"


def _rows(step: Step, arr: np.ndarray, name: str = "") -> list[str] | None:
    if name in step.array_labels:
        return step.array_labels[name][0]
    return step.row_labels if np.atleast_2d(arr).shape[0] == len(step.row_labels or []) else None


def _cols(step: Step, arr: np.ndarray, name: str = "") -> list[str] | None:
    if name in step.array_labels:
        return step.array_labels[name][1]
    a = np.atleast_2d(arr)
    return step.col_labels if step.col_labels and a.shape[1] == len(step.col_labels) else None


def walkthrough_renderables(w: Walkthrough, width: int = 120, full: bool = False) -> list[RenderableType]:
    """The walkthrough for a terminal `width` characters wide."""
    out: list[RenderableType] = [Text(_header(w), style="bold")]
    for n, step in enumerate(w.steps, 1):
        parts: list[RenderableType] = [Text(f"\n{_step_heading(n, step)}", style="bold cyan")]
        if step.text:
            parts.append(Text(step.text))
        if step.shape:
            parts.append(Text(f"shape {step.shape}", style="dim"))
        for name, arr in step.arrays.items():
            parts += matrix_renderables(name, arr, _rows(step, arr, name), _cols(step, arr, name), width, full,
                                        step.integer_cols)
        if any(_has_min(a) for a in step.arrays.values()):
            parts.append(Text(MIN_NOTE, style="dim"))
        out.append(Group(*parts))
    if w.check:
        out.append(Text("\n" + check_line(w), style="bold green" if w.check.get("ok") else "bold red"))
    return out


def _header(w: Walkthrough) -> str:
    if w.model.get("name") == "toy example":
        causal = ", causal" if w.model.get("causal") else ""
        return (f"Self-attention by hand: the 3-input toy example{causal} (steps numbered as the classic 7; "
                "inputs counted from 1, as the tutorials do)")
    focus = "" if w.token is None else f", query token {w.token}"
    kind = "" if w.attention == "self" else f" {ATTENTION_LABELS[w.attention]},"
    return (f"{w.model.get('name', '?')}:{kind} layer {w.layer}, head {w.head}{focus} (0-indexed; "
            f"{w.model.get('layers')} layers x {w.model.get('heads')} heads)")


def check_line(w: Walkthrough) -> str:
    """The head's verdict and the whole trace's, each said once: a head can match while another layer fails."""
    c = w.check
    if c.get("unsupported"):
        return f"check: {c['unsupported']}; captured numbers shown as the model produced them"
    tolerance = float(c.get("tolerance", 0.0))
    head_error = c.get("head_max_error")
    head_ok = head_error is not None and head_error <= tolerance  # NaN is not <=: not OK
    if head_ok:
        head = (f"OK: every stage of layer {w.layer} head {w.head} recomputed from the layer's weights matches the "
                "model's forward pass")
    else:
        head = (f"FAILED: a stage of layer {w.layer} head {w.head} recomputed from the layer's weights differs from "
                "the model's forward pass")
    whole = "PASS" if c.get("ok") else "FAIL (attnscope check shows where)"
    return (f"check: {head}: max error {error(head_error or 0.0)} (tolerance {error(tolerance)}); whole trace: "
            f"{whole}, max error {error(c.get('max_error') or 0.0)}")


def _md_table(name: str, cells: Cells, full: bool) -> list[str]:
    rows: list[int | None] = list(range(cells.shape[0])) if full else _keep(cells.shape[0], MAX_ROWS)
    cols: list[int | None] = list(range(cells.shape[1])) if full else _keep(cells.shape[1], MD_COLS)
    header = ["", *(ELLIPSIS if j is None else cells.cols[j] for j in cols)]
    body = [[ELLIPSIS if i is None else cells.rows[i],
             *(ELLIPSIS if i is None or j is None else cells.row(i)[j] for j in cols)] for i in rows]
    notes = [n for n in (_elided("rows", rows, cells.shape[0]), _elided("columns", cols, cells.shape[1])) if n]
    lines = [f"`{name}` {list(cells.shape)}", "", _md_row(header), _md_row(["---"] * len(header)),
             *map(_md_row, body), ""]
    return lines + ([f"*{'; '.join(notes)}: `--full` prints them all*", ""] if notes else [])


def walkthrough_markdown(w: Walkthrough, full: bool = False) -> str:
    lines = [f"# {_header(w)}", ""]
    for n, step in enumerate(w.steps, 1):
        lines += [f"## {step.number or n}. {step.title} (`{step.stage}`)", ""]
        if step.text:
            lines += [step.text, ""]
        if step.shape:
            lines += [f"Shape: `{step.shape}`", ""]
        for name, arr in step.arrays.items():
            cells = Cells(arr, _rows(step, arr, name), _cols(step, arr, name), step.integer_cols)
            lines += _md_table(name, cells, full)
            lines += [MIN_NOTE, ""] if _has_min(arr) else []
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
        **({} if w.attention == "self" else {"attention": w.attention, "key_tokens": w.key_tokens}),
        "steps": [
            {"stage": s.stage, "number": s.number or str(n), "title": s.title, "text": s.text, "shape": s.shape,
             "row_labels": s.row_labels, "col_labels": s.col_labels,
             **({"array_labels": {k: list(v) for k, v in s.array_labels.items()}} if s.array_labels else {}),
             "arrays": {k: _json_array(v) for k, v in s.arrays.items()}}
            for n, s in enumerate(w.steps, 1)
        ],
        "check": w.check,
    }


# What the web app's explanation shows of an array (serve/assets/serve.js: MAX_ROWS, MAX_COLS, KEY_STAGES)
SHOWN_ROWS = 12
SHOWN_COLS = 64
KEY_STAGES = ("scores", "scaled", "masked", "weights")  # columns are keys: the page keeps the clicked key's


def walkthrough_shown_json(w: Walkthrough) -> dict[str, Any]:
    """The walkthrough as the web app's explanation shows it: walkthrough_json's fields without the per-step
    labels (the page labels rows and columns from `tokens`); each step's "arrays" holds only the cells the page can
    show of each array (nested lists, float32 in their shortest exact form, as walkthrough_json), and its "shown"
    says where they sit (shown_array). At 2,048 SmolLM2 tokens ~0.3 MB instead of ~30 MB of JSON lists."""
    n = len(w.tokens)
    steps = []
    for i, s in enumerate(w.steps, 1):
        kept = {k: shown_array(v, n, w.token, s.stage in KEY_STAGES) for k, v in s.arrays.items()}
        steps.append({"stage": s.stage, "number": s.number or str(i), "title": s.title, "text": s.text,
                      "shape": s.shape, "arrays": {k: cells for k, (cells, _) in kept.items()},
                      "shown": {k: where for k, (_, where) in kept.items()}})
    return {
        "model": w.model, "layer": w.layer, "head": w.head, "token": w.token, "tokens": w.tokens, "arrays": "shown",
        **({} if w.attention == "self" else {"attention": w.attention, "key_tokens": w.key_tokens}),
        "steps": steps, "check": w.check,
    }


def shown_rows(n: int, limit: int, must: int | None = None) -> list[int]:
    """The indices the page's keep(n, limit, must) shows of an axis of length n: all, or the first limit - 2
    (the last of them replaced by `must` when it is elsewhere) and the last two."""
    if n <= limit:
        return list(range(n))
    head = list(range(limit - 2))
    if must is not None and 0 <= must < n and must not in (*head, n - 2, n - 1):
        head[-1] = must
    return [*sorted(head), n - 2, n - 1]


def shown_array(arr: np.ndarray, n_tokens: int, must: int | None, key_stage: bool) -> tuple[Any, dict[str, Any]]:
    """One array [rows, cols] (1-D: one row) as the page shows it: the kept cells, as nested lists (rows x columns
    kept), and where they sit: its shape, the kept rows (the focused query's kept in view, as the page's keep()) and
    columns (None: every column, as for a key stage, whose clicked key the page keeps in view), and whether every
    value of the whole array is a whole number under 1e6 (the page then prints integers, as it did from all)."""
    a = np.atleast_2d(np.asarray(arr))
    rows_n, cols_n = a.shape
    rows = shown_rows(rows_n, SHOWN_ROWS, must if rows_n == n_tokens else None)
    cols = None if key_stage and cols_n == n_tokens else shown_rows(cols_n, SHOWN_COLS)
    kept = a[rows] if cols is None else a[np.ix_(rows, cols)]
    whole = bool(np.all(np.isfinite(a) & (a == np.round(a)) & (np.abs(a) < 1e6))) if a.dtype.kind == "f" else (
        bool(np.all(np.abs(a) < 1e6)) if a.dtype.kind in "iu" else False)  # JS: a boolean is no integer
    return _json_array(kept), {"shape": [rows_n, cols_n], "rows": rows, "cols": cols, "integers": whole}


def _json_array(arr: np.ndarray) -> Any:
    """Nested lists; float32 values in their shortest exact form (0.1, not 0.10000000149011612)."""
    a = np.asarray(arr)
    if a.dtype == np.float32:
        return a.astype(str).astype(np.float64).tolist()  # each string parses back to the same float32
    return a.tolist()


def _extent(report: CheckReport) -> tuple[int, int]:
    """(layers, heads) the comparisons cover."""
    shapes = [c.errors.shape for c in report.comparisons]
    return max(s[0] for s in shapes), max(s[1] for s in shapes)


def compared(report: CheckReport) -> str:
    """What a check compared: '9 stage comparisons x 6 layers x 12 heads' (a stage may be compared twice)."""
    layers, heads = _extent(report)
    return f"{len(report.comparisons)} stage comparisons x {layers} layers x {heads} heads"


ERROR_WIDTH = len("0.0e+00")  # an error as printed: a cell never folds it over two lines nor crops it
CHECK_TITLE = "max error per layer (0-indexed, max over heads)"


def check_table(report: CheckReport, n_layers: int, width: int | None = None) -> RenderableType:
    """Rows: each stage compared with the recompute or the model; columns: layers (0-indexed), max over heads.
    When the layers do not fit the width (deep models), rows are the layers and columns the comparisons, in as
    many tables, one under the other, as the width needs: every number whole, none cropped."""
    stage_width = max([len("stage"), *(len(_stage_label(c)) for c in report.comparisons)])
    # a column is its widest cell, 1 space of padding and 1 of separator (none after the last)
    by_stage = stage_width + len("recompute") + 2 + (ERROR_WIDTH + 2) * n_layers
    if width is None or by_stage <= width:
        title = f"{CHECK_TITLE}: captured vs the independent recompute and vs the model's own outputs"
        tables: list[RenderableType] = [_check_table_by_stage(report, n_layers)]
    else:
        title = (f"{CHECK_TITLE} of each stage: captured vs the independent recompute (rec) and vs the model's own "
                 "outputs (model)")
        per_table = max(1, (width - len("layer") - 1) // (ERROR_WIDTH + 2))  # comparisons beside the layer column
        n_tables = -(-len(report.comparisons) // per_table)
        size = -(-len(report.comparisons) // n_tables)  # balanced: 9 columns in 2 tables are 5 and 4
        parts = [report.comparisons[i:i + size] for i in range(0, len(report.comparisons), size)]
        tables = [_check_table_by_layer(part, report.tolerance, n_layers) for part in parts]
    # the title and the note wrap to the terminal, not to the table: a table of one column is narrow
    note = [Text(REL_NOTE)] if any(c.relative for c in report.comparisons) else []
    return Group(Text(title), *tables, *note)


def _stage_label(c: Comparison) -> str:
    """The stage as the tables name it: "(rel)" where its errors are relative to a rounding bound (REL_NOTE)."""
    return f"{c.stage} (rel)" if c.relative else c.stage


def _check_table_by_stage(report: CheckReport, n_layers: int) -> Table:
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    t.add_column("stage", no_wrap=True)
    t.add_column("vs", no_wrap=True)
    for layer in range(n_layers):
        t.add_column(f"L{layer}", justify="right", no_wrap=True, min_width=ERROR_WIDTH)
    for c in report.comparisons:
        errors = (_err(float(c.errors[layer].max()), report.tolerance) for layer in range(n_layers))
        t.add_row(_stage_label(c), c.source, *errors)
    return t


def _check_table_by_layer(comparisons: list[Comparison], tolerance: float, n_layers: int) -> Table:
    """Rows: layers; columns: these comparisons."""
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    t.add_column("layer", justify="right", no_wrap=True)
    for c in comparisons:
        # the header folds over lines, a number never does
        t.add_column(f"{_stage_label(c)} {'rec' if c.source == 'recompute' else c.source}",
                     justify="right", overflow="fold", min_width=ERROR_WIDTH)
    for layer in range(n_layers):
        t.add_row(str(layer), *(_err(float(c.errors[layer].max()), tolerance) for c in comparisons))
    return t


def _err(e: float, tol: float) -> str:
    style = "green" if e <= tol else "bold red"
    return f"[{style}]{error(e)}[/{style}]"


def check_summary(report: CheckReport) -> str:
    if not report.comparisons and report.unsupported:
        return f"NOT VERIFIED: {report.unsupported}"
    verdict = report.status  # PASS, FAIL or NOT VERIFIED (nothing recomputed: never PASS)
    if verdict == "NOT VERIFIED":
        return (f"NOT VERIFIED: {report.unsupported or 'nothing was recomputed'} (the captured numbers only match "
                f"the model's own outputs: max error {error(report.max_error)} over {compared(report)})")
    extra = f"; {report.unsupported}" if report.unsupported else ""
    return (f"{verdict}: max error {error(report.max_error)} over {compared(report)} "
            f"(tolerance {error(report.tolerance)}){extra}")


def check_markdown(report: CheckReport, n_layers: int, header: str = "") -> str:
    """The check as Markdown: the header line (model, tokens), a table per layer, the notes and the verdict."""
    heads = ["layer", *(f"{_stage_label(c)} vs {c.source}" for c in report.comparisons)]
    rows = [[str(i), *(error(float(c.errors[i].max())) for c in report.comparisons)] for i in range(n_layers)]
    top = [header, ""] if header else []
    table = [_md_row(heads), _md_row(["---"] * len(heads)), *map(_md_row, rows), "", REL_NOTE, ""]
    return "\n".join([*top, *(table if report.comparisons else []), check_summary(report), ""])


def to_text(renderables: list[RenderableType], width: int = 120) -> str:
    """Render rich objects to plain text (for files and tests)."""
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, highlight=False).print(*renderables)
    return buf.getvalue()
