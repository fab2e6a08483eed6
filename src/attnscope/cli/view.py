"""view: write a self-contained HTML page with the head, model, neuron and matrix views, or one view as a figure
(SVG, PNG at a chosen scale, PDF)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from attnscope.cli.common import add_text_args
from attnscope.cli.core import traced
from attnscope.errors import AttnscopeError
from attnscope.views.size import MAX_PAGE_MB, PageSize, page_size, validate_page_size


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
    p.add_argument("--word-level", action="store_true",
                   help="also carry word-level maps (pieces merged as stats --word-level does) behind a toggle")
    p.add_argument("--max-mb", type=float, default=MAX_PAGE_MB, metavar="MB",
                   help=f"refuse a page that would exceed MB megabytes, measured before it is built (default "
                        f"{MAX_PAGE_MB:g}; a 2,048-token map takes 5.6 MB: choose --layers and --heads)")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="FILE.html (the page), or one view as a figure: FILE.svg, FILE.png or FILE.pdf")
    p.add_argument("--format", default=None, metavar="FORMAT",
                   help="html, svg, png or pdf (default: from FILE's suffix)")
    p.add_argument("--scale", type=float, default=None,
                   help="png: the figure (as the SVG) at this many pixels per SVG pixel; without it, a png is a "
                        "picture of the page at --width")
    p.add_argument("--width", type=int, default=1280, metavar="PX", help="width of a --view all png (default 1280)")
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


FORMATS = ("html", "svg", "png", "pdf")
SUFFIXES = {".html": "html", ".htm": "html", "": "html", ".svg": "svg", ".png": "png", ".pdf": "pdf"}


def output_format(args: argparse.Namespace) -> str:
    suffix = Path(args.output).suffix.lower()
    fmt = (args.format or SUFFIXES.get(suffix, suffix.lstrip("."))).lower()
    if fmt not in FORMATS:
        raise AttnscopeError(f"unsupported output format {fmt!r}: name the output FILE.html, FILE.svg, FILE.png "
                             "or FILE.pdf (or pass --format)")
    if fmt != "html" and suffix not in (f".{fmt}", ""):
        raise AttnscopeError(f"--format {fmt} writes a {fmt.upper()}: name the output FILE.{fmt}, "
                             f"not {Path(args.output).name!r}")
    if fmt in ("svg", "pdf") and args.view == "all":
        raise AttnscopeError(f"a {fmt} figure shows one view: add --view head, model, matrix or neuron")
    if args.scale is not None and fmt != "png":
        raise AttnscopeError(f"--scale sizes a png figure: name the output FILE.png, not {Path(args.output).name!r}")
    return fmt


def run_view(args: argparse.Namespace) -> int:
    fmt = output_format(args)
    layers, heads = indices(args.layers, "layers"), indices(args.heads, "heads")
    figure = fmt in ("svg", "pdf") or (fmt == "png" and args.scale is not None)
    scale = 2.0 if args.scale is None else args.scale
    if figure:
        from attnscope.views.figures import validate_figure

        validate_figure(args.view, scale)
    validate_page_size(PageSize(0, 0, 0, 0, 0), args.max_mb, flags=True)
    tr = traced(args)
    from attnscope.traces import Trace
    from attnscope.views import to_html  # heavy: after the input checks

    neuron = "all" if figure and args.view == "neuron" else args.neuron
    if isinstance(tr, Trace):  # measured before the page is built, refused in the CLI's words
        carried = neuron if args.view in ("neuron", "all") else "none"
        validate_page_size(page_size(tr, layers, heads, carried, args.word_level), args.max_mb, flags=True)
    show_heads = [args.head] if args.view == "head" and args.head is not None else None
    html = to_html(tr, args.view, layers=layers, heads=heads, layer=args.layer, head=args.head, query=args.token,
                   show_heads=show_heads, theme="light" if figure else args.theme, neuron=neuron,
                   word_level=args.word_level, max_mb=args.max_mb)
    out = Path(args.output)
    if figure:
        from attnscope.views.figures import render_figure

        render_figure(html, out, fmt, scale)
    elif fmt == "png":
        from attnscope.views.browser import render_png

        render_png(html, out, width=args.width)
    else:
        try:
            out.write_text(html, encoding="utf-8")
        except OSError as exc:
            raise AttnscopeError(f"cannot write {out}: {exc.strerror or exc}") from exc
    size = out.stat().st_size
    what = f"figure of the {args.view} view" if figure else f"{args.view} view{'s' if args.view == 'all' else ''}"
    print(f"wrote {out}: {what} of {tr.n_tokens} tokens, "
          f"{tr.n_layers} layers x {tr.n_heads} heads ({size / 1e6:.2f} MB, {fmt})")
    return 0
