"""view: write a self-contained HTML page (or a PNG picture of it) with the head, model, neuron and matrix views."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from attnscope.cli.common import add_text_args
from attnscope.cli.core import traced
from attnscope.errors import AttnscopeError


def register(sub: Any) -> None:
    p = sub.add_parser("view", help="write interactive attention views as one self-contained HTML file (or PNG)")
    add_text_args(p)
    p.add_argument("--view", choices=("head", "model", "neuron", "matrix", "all"), default="all",
                   help="which view (default all: every view as tabs)")
    p.add_argument("--layers", nargs="+", metavar="L",
                   help="layers to include, 0-indexed (e.g. 0 1 or 0,1; default all)")
    p.add_argument("--heads", nargs="+", metavar="H", help="heads to include, 0-indexed (default all)")
    p.add_argument("--layer", type=int, default=None, help="layer shown first (0-indexed)")
    p.add_argument("--head", type=int, default=None, help="head shown first in the matrix and neuron views")
    p.add_argument("--token", type=int, default=None, help="query token selected first (0-indexed)")
    p.add_argument("--theme", choices=("auto", "light", "dark"), default="auto", help="colour theme (default auto)")
    p.add_argument("--neuron", choices=("budget", "all", "none"), default="budget",
                   help="exact numbers carried for the neuron view: a size budget (default), every head, or none")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="FILE.html, or FILE.png with --format png")
    p.add_argument("--format", choices=("html", "png"), default=None,
                   help="html (default) or png, a picture through headless Chromium; guessed from FILE's suffix")
    p.add_argument("--width", type=int, default=1280, metavar="PX", help="picture width for png (default 1280)")
    p.set_defaults(func=run_view)


def indices(values: list[str] | None, kind: str) -> list[int] | None:
    """["0", "2,3"] -> [0, 2, 3]; a clear error for anything that is not a whole number."""
    if values is None:
        return None
    out = []
    for part in ",".join(values).split(","):
        if not part.strip():
            continue
        try:
            out.append(int(part))
        except ValueError as exc:
            raise AttnscopeError(f"--{kind} takes whole numbers (0-indexed), got {part!r}") from exc
    return out


def output_format(args: argparse.Namespace) -> str:
    fmt = args.format or ("png" if Path(args.output).suffix.lower() == ".png" else "html")
    if fmt == "png" and Path(args.output).suffix.lower() not in (".png", ""):
        raise AttnscopeError(f"--format png writes a PNG: name the output FILE.png, not {Path(args.output).name!r}")
    return fmt


def run_view(args: argparse.Namespace) -> int:
    fmt = output_format(args)
    layers, heads = indices(args.layers, "layers"), indices(args.heads, "heads")
    tr = traced(args)
    from attnscope.views import to_html  # heavy: after the input checks

    html = to_html(tr, args.view, layers=layers, heads=heads, layer=args.layer, head=args.head, query=args.token,
                   theme=args.theme, neuron=args.neuron)
    out = Path(args.output)
    if fmt == "png":
        from attnscope.views.browser import render_png

        render_png(html, out, width=args.width)
    else:
        try:
            out.write_text(html, encoding="utf-8")
        except OSError as exc:
            raise AttnscopeError(f"cannot write {out}: {exc.strerror or exc}") from exc
    size = out.stat().st_size
    print(f"wrote {out}: {args.view} view{'s' if args.view == 'all' else ''} of {tr.n_tokens} tokens, "
          f"{tr.n_layers} layers x {tr.n_heads} heads ({size / 1e6:.2f} MB, {fmt})")
    return 0
