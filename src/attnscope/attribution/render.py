"""An Attribution as text (rich tables), Markdown or JSON: per target, one row per method, one column per token,
and beside each method its check (PASS / FAIL / NOT VERIFIED, the measured value against its bound) and cost."""

from __future__ import annotations

from typing import Any

import numpy as np

from attnscope.attribution.record import Attribution, MethodScores

# Column labels in the text table (a terminal is narrow); the legend under the table spells them out.
SHORT = {"attention": "attn", "rollout": "rollout", "flow": "flow", "attention_x_gradient": "AxG", "saliency": "sal",
         "input_x_gradient": "IxG", "integrated_gradients": "IG", "leave_one_out": "LOO", "leave_one_out_replaced":
         "LOO-r", "alti": "ALTI", "norm": "norm", "value_zeroing": "VZ"}


def _cell(x: float) -> str:
    return "nan" if not np.isfinite(x) else f"{x:.3g}"


def _score_cell(ms: MethodScores, t: int, i: int) -> str:
    """One score; "n/a" where the method leaves the token unscored (the legend says why), "nan" for any other NaN."""
    return "n/a" if i in ms.unscored else _cell(float(ms.scores[t, i]))


def _check_cell(ms: MethodScores) -> str:
    c = ms.check
    if c.verified is None:
        return f"NOT VERIFIED: {c.detail}"
    return f"{c.status} {c.name} {_cell(c.value)} <= {c.bound:.1g}" if c.verified else \
        f"FAIL {c.name} {_cell(c.value)} > {c.bound:.1g}"


def _cost_cell(ms: MethodScores) -> str:
    return f"{ms.cost.forwards} F, {ms.cost.backwards} B, {ms.cost.seconds:.2f} s"


def _token_labels(a: Attribution, raw_tokens: bool = False) -> list[str]:
    """"index:token" per token: as a person reads it (Token.shown: " capital" for GPT-2's "Ġcapital"), or
    raw_tokens the tokenizer's own piece; a control character (a newline piece) spelled as an escape."""
    labels = []
    for t in a.tokens:
        shown = t.text if raw_tokens else t.shown
        labels.append(f"{t.index}:{shown if shown.isprintable() else repr(shown)[1:-1]}")
    return labels


def summary_line(a: Attribution) -> str:
    """One line: the verdict over every method's check."""
    failed = [n for n, m in a.methods.items() if m.check.status == "FAIL"]
    unverified = [n for n, m in a.methods.items() if m.check.verified is None]
    line = f"{a.status}: {len(a.methods)} methods"
    if failed:
        line += f"; FAIL: {', '.join(failed)}"
    if unverified:
        line += f"; NOT VERIFIED: {', '.join(unverified)}"
    return line


def methods_legend(a: Attribution) -> list[str]:
    """One line per method: its unit, settings and check detail; then one per method left out, with why."""
    out = []
    for name, ms in a.methods.items():
        settings = ", ".join(f"{k} {v}" for k, v in ms.settings.items() if k not in ("f_x", "f_baseline"))
        out.append(f"{name}: {ms.unit}{'; ' + settings if settings else ''}. Check: {ms.check.detail}")
        out += [f"{name}: token {i} ({a.tokens[i].text}) n/a: {why}" for i, why in sorted(ms.unscored.items())]
    why: dict[str, list[str]] = {}  # the reason after "<method> does not apply to <model>: " -> methods
    for name, reason in a.skipped.items():
        why.setdefault(reason.split("): ", 1)[-1], []).append(name)
    out += [f"not run, not applying to {a.model}: {', '.join(names)}: {reason}" for reason, names in why.items()]
    return out


def text_renderables(a: Attribution, raw_tokens: bool = False) -> list[Any]:
    """rich renderables: a header; per target a table (a row per token, a column per method); the checks table
    (check, measured value, bound, cost per method); the legend; the verdict. Every text from the input or the
    model (tokens, targets, names) is escaped: a token "[bold]" prints as itself. raw_tokens: _token_labels."""
    from rich.markup import escape
    from rich.table import Table

    out: list[Any] = [escape(f"{a.model} ({a.architecture}): {a.description}")]
    for t, target in enumerate(a.targets):
        table = Table(title=escape(f"target {t} (0-indexed): {target!r}"), title_justify="left")
        table.add_column("token")
        for name in a.methods:
            table.add_column(escape(SHORT.get(name, name)), justify="right")
        for i, label in enumerate(_token_labels(a, raw_tokens)):
            table.add_row(escape(label), *(_score_cell(ms, t, i) for ms in a.methods.values()))
        out.append(table)
    checks = Table(title="checks", title_justify="left")
    for col in ("method", "check", "cost"):
        checks.add_column(col, justify="right" if col == "cost" else "left")
    for name, ms in a.methods.items():
        checks.add_row(escape(name), escape(_check_cell(ms)), _cost_cell(ms))
    out.append(checks)
    for t, target in enumerate(a.targets):
        out.append(_agreement_table(a, t, target))
    out.append(escape("columns: " + ", ".join(f"{SHORT.get(n, n)} = {n}" for n in a.methods)))
    out += [escape(line) for line in methods_legend(a)]
    out.append(escape(summary_line(a)))
    return out


def _agreement_table(a: Attribution, t: int, target: str) -> Any:
    from rich.markup import escape
    from rich.table import Table

    rho = a.rank_agreement(t)
    table = Table(title=escape(f"rank agreement (Spearman) over the tokens{_left_out(a)}, target {t}: {target!r}"),
                  title_justify="left")
    table.add_column("")
    labels = [SHORT.get(n, n) for n in a.methods]
    for label in labels:
        table.add_column(escape(label), justify="right")
    for label, row in zip(labels, rho, strict=True):
        table.add_row(escape(label), *(_cell(float(x)) for x in row))
    return table


def _left_out(a: Attribution) -> str:
    """" but token 9 (n/a)" when some method leaves tokens unscored (Attribution.ranked_tokens)."""
    kept = set(a.ranked_tokens())
    gone = [str(i) for i in range(len(a.tokens)) if i not in kept]
    return f" but token{'s' if len(gone) > 1 else ''} {', '.join(gone)} (n/a)" if gone else ""


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(a: Attribution, raw_tokens: bool = False) -> str:
    """The same tables in GitHub Markdown (raw_tokens: as text_renderables)."""
    lines = [f"**{_md(a.model)} ({_md(a.architecture)})**: {_md(a.description)}", ""]
    for t, target in enumerate(a.targets):
        lines += [f"Target {t} (0-indexed): `{_md(repr(target))}`", ""]
        labels = [f"`{_md(x)}`" for x in _token_labels(a, raw_tokens)]
        lines.append("| method | " + " | ".join(labels) + " | check | cost |")
        lines.append("|---|" + "---:|" * len(labels) + "---|---:|")
        for name, ms in a.methods.items():
            cells = " | ".join(_score_cell(ms, t, i) for i in range(len(a.tokens)))
            lines.append(f"| {name} | {cells} | {_md(_check_cell(ms))} | {_cost_cell(ms)} |")
        lines.append("")
    for t in range(len(a.targets)):
        lines += _agreement_markdown(a, t)
    lines += [f"- {_md(line)}" for line in methods_legend(a)]
    lines += ["", f"**{summary_line(a)}**", ""]
    return "\n".join(lines)


def _agreement_markdown(a: Attribution, t: int) -> list[str]:
    names = list(a.methods)
    lines = [f"Rank agreement (Spearman) over the tokens{_md(_left_out(a))}, target {t}:", "",
             "| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for name, row in zip(names, a.rank_agreement(t), strict=True):
        lines.append(f"| {name} | " + " | ".join(_cell(float(x)) for x in row) + " |")
    return [*lines, ""]


def json_data(a: Attribution) -> dict[str, Any]:
    """Strict JSON (NaN as null)."""
    return a.to_json()
