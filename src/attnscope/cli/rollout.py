"""rollout and flow: one query token's attention traced down to the input tokens, across all layers."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from attnscope.cli.common import add_format, add_text_args, console, integer, print_json

if TYPE_CHECKING:
    from rich.table import Table

    from attnscope.tracing.one_pass import Trace

# Heavy imports (torch, transformers, scipy) happen inside the commands, so --help is instant.
BAR_WIDTH = 24


def register(sub: Any) -> None:
    p = sub.add_parser("rollout", help="attention rollout: how much each input token reaches a token, across layers")
    add_text_args(p)
    _add_token(p)
    p.add_argument("--layer", type=integer, default=None,
                   help="rollout after this layer, 0-indexed (default: the top layer)")
    add_format(p)
    p.set_defaults(func=run_rollout)

    p = sub.add_parser("flow", help="attention flow: max-flow from a top-layer token to each input token")
    add_text_args(p)
    _add_token(p)
    p.add_argument("--max-tokens", type=integer, default=64, metavar="N",
                   help="refuse longer texts: the cost grows like tokens^4 (default 64)")
    add_format(p)
    p.set_defaults(func=run_flow)


def _add_token(p: argparse.ArgumentParser) -> None:
    p.add_argument("--token", type=integer, default=None, metavar="I",
                   help="the query token, 0-indexed (default: [CLS] = 0, or the last token for causal models)")


def run_rollout(args: argparse.Namespace) -> int:
    from attnscope.cli.core import traced

    tr = traced(args)
    layer = tr.n_layers - 1 if args.layer is None else args.layer
    token = _query_token(tr, args.token)
    tr.validate(layer=layer)
    values = tr.rollout()[layer, token]  # [key]
    what = f"attention rollout after layer {layer} (0-indexed, of {tr.n_layers})"
    payload = row_payload(tr, "rollout", layer, token, values)
    note = causal_pile_up(tr.causal, layer, token, float(values[0]))
    emit(payload | {"note": note} if note else payload, what, args.format)
    return 0


PILE_UP = 0.9  # the share on token 0 above which a causal model's rollout is explained


def causal_pile_up(causal: bool, layer: int, token: int, first: float) -> str | None:
    """Why a causal model's rollout puts (nearly) everything on token 0, when it does: position 0 reads only
    itself at every layer, so every path that reaches it at any layer ends there. Else None. The views' source
    switch says the same beside "attention rollout" (CAUSAL_ROLLOUT in views/assets/controls.js)."""
    if not causal or token == 0 or first < PILE_UP:
        return None
    return (f"in a causal model position 0 reads only itself at every layer, so every path that reaches "
            f"it ends on token 0: over {layer + 1} layers rollout gathers {first:.0%} there. A lower --layer "
            "shows the mixing before that.")


def run_flow(args: argparse.Namespace) -> int:
    from attnscope.cli.core import traced

    tr = traced(args)
    token = _query_token(tr, args.token)
    values = tr.flow(max_tokens=args.max_tokens)[token]  # [key]
    what = f"attention flow from the top layer ({tr.n_layers} layers)"
    emit(row_payload(tr, "flow", tr.n_layers - 1, token, values), what, args.format)
    return 0


def _query_token(tr: Trace, token: int | None) -> int:
    """The asked-for query token, or the default: [CLS] (0), the last token for causal models."""
    chosen = (tr.n_tokens - 1 if tr.causal else 0) if token is None else token
    tr.validate(token=chosen)
    return chosen


def row_payload(tr: Trace, method: str, layer: int, token: int, values: Any) -> dict[str, Any]:
    """One query row over the input tokens, JSON-able. Indices are 0-indexed."""
    return {
        "method": method,
        "model": tr.model.get("name"),
        "layer": layer,
        "layers": tr.n_layers,
        "query": {"index": token, "token": tr.tokens[token].text},
        "keys": [{"index": t.index, "token": t.text, "value": float(v)}
                 for t, v in zip(tr.tokens, values, strict=True)],
    }


def emit(payload: dict[str, Any], what: str, fmt: str) -> None:
    q = payload["query"]
    title = f"{payload['model']}: {what}, query token {q['index']} {q['token']!r} over the input tokens"
    note = payload.get("note")
    if fmt == "json":
        print_json(payload)
    elif fmt == "markdown":
        sys.stdout.write(row_markdown(payload, title) + (f"\nnote: {note}\n" if note else ""))
    else:
        from rich.text import Text

        console().print(Text(title), row_table(payload), *([Text(f"note: {note}")] if note else []))


def _bar(value: float, top: float) -> str:
    return "█" * round(BAR_WIDTH * value / top) if top > 0 else ""


def row_table(payload: dict[str, Any]) -> Table:
    from rich.table import Table
    from rich.text import Text

    keys = payload["keys"]
    top = max(k["value"] for k in keys)
    t = Table(show_edge=False, pad_edge=False)
    t.add_column("key", justify="right")
    t.add_column("token")
    t.add_column(payload["method"], justify="right")
    t.add_column("")
    for k in keys:
        # Text(): a token such as "[CLS]" must not be read as rich markup
        t.add_row(str(k["index"]), Text(k["token"]), f"{k['value']:.4f}", _bar(k["value"], top))
    return t


def row_markdown(payload: dict[str, Any], title: str) -> str:
    def cell(s: str) -> str:
        return s.replace("\\", "\\\\").replace("|", "\\|").replace("`", "\\`")

    lines = [f"# {cell(title)}", "", f"| key | token | {payload['method']} |", "| ---: | --- | ---: |"]
    lines += [f"| {k['index']} | {cell(k['token'])} | {k['value']:.4f} |" for k in payload["keys"]]
    return "\n".join([*lines, ""])
