"""view: write a self-contained HTML page with the head, model, neuron and matrix views, or one view as a figure
(SVG, PNG at a chosen scale, PDF)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnscope.cli.common import add_text_args, integer, model_of, real
from attnscope.cli.core import add_target_args, require_encoder_decoder, traced_any
from attnscope.errors import AttnscopeError
from attnscope.stages import ATTENTION_KINDS, ATTENTION_LABELS
from attnscope.views.size import MAX_PAGE_MB, PageSize, family_page_size, page_size, validate_page_size

if TYPE_CHECKING:
    from attnscope.records.trace import EncoderDecoderTrace, Trace


def register(sub: Any) -> None:
    p = sub.add_parser("view", help="write interactive attention views as one self-contained HTML file (or PNG)")
    add_text_args(p)
    add_target_args(p)
    p.add_argument("--attention", choices=ATTENTION_KINDS, default=None,
                   help="encoder-decoder models: the kind of attention shown first, or the one a figure shows "
                        "(default: encoder)")
    p.add_argument("--view", choices=("head", "model", "neuron", "matrix", "all"), default="all",
                   help="which view (default all: every view as tabs)")
    p.add_argument("--layers", nargs="+", metavar="L",
                   help="layers to include, 0-indexed (e.g. 0 1 or 0,1; default all)")
    p.add_argument("--heads", nargs="+", metavar="H", help="heads to include, 0-indexed (default all)")
    p.add_argument("--layer", type=integer, default=None, help="layer shown first (0-indexed)")
    p.add_argument("--head", type=integer, default=None, help="head shown first in the matrix and neuron views")
    p.add_argument("--token", type=integer, default=None, help="query token selected first (0-indexed)")
    p.add_argument("--theme", choices=("auto", "light", "dark"), default="auto", help="colour theme (default auto)")
    p.add_argument("--neuron", choices=("budget", "all", "none"), default="budget",
                   help="exact numbers carried for the neuron view: a size budget (default), every head, or none")
    p.add_argument("--word-level", action="store_true",
                   help="also carry word-level maps (pieces merged as stats --word-level does) behind a toggle")
    p.add_argument("--max-mb", type=real, default=MAX_PAGE_MB, metavar="MB",
                   help=f"refuse a page that would exceed MB megabytes, measured before it is built (default "
                        f"{MAX_PAGE_MB:g}; a 2,048-token map takes 5.6 MB: choose --layers and --heads)")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="FILE.html (the page), or one view as a figure: FILE.svg, FILE.png or FILE.pdf")
    p.add_argument("--format", default=None, metavar="FORMAT",
                   help="html, svg, png or pdf (default: from FILE's suffix)")
    p.add_argument("--scale", type=real, default=None,
                   help="png: the figure (as the SVG) at this many pixels per SVG pixel; without it, a png is a "
                        "picture of the page at --width")
    p.add_argument("--width", type=integer, default=1280, metavar="PX",
                   help="width of a --view all png, 320..7680 (default 1280)")
    p.add_argument("--no-caption", dest="caption", action="store_false",
                   help="a figure (svg, png, pdf) without its caption (model, selection, verification badge)")
    p.add_argument("--raw-tokens", action="store_true",
                   help="show tokens as the tokenizer spells its pieces, with byte-level marks (GPT-2's 'Ġ' for a "
                        "space, 'Ċ' for a newline); by default each reads as the tokenizer decodes it")
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
    if not args.caption and fmt == "html":
        raise AttnscopeError("--no-caption is for a figure: name the output FILE.svg, FILE.png or FILE.pdf "
                             "(a page has no caption)")
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
    tr = _traced(args)
    from attnscope.views import to_html  # heavy: after the input checks

    neuron = "all" if figure and args.view == "neuron" else args.neuron
    carried = neuron if args.view in ("neuron", "all") else "none"  # measured before the page is built
    validate_page_size(_size(tr, layers, heads, carried, args.word_level), args.max_mb, flags=True)
    show_heads = [args.head] if args.view == "head" and args.head is not None else None
    html = to_html(tr, args.view, layers=layers, heads=heads, layer=args.layer, head=args.head, query=args.token,
                   show_heads=show_heads, theme="light" if figure else args.theme, neuron=neuron,
                   word_level=args.word_level, attention=args.attention, max_mb=args.max_mb,
                   raw_tokens=args.raw_tokens)
    out = Path(args.output)
    if figure:
        from attnscope.views.figures import render_figure

        render_figure(html, out, fmt, scale, caption=args.caption)
    elif fmt == "png":
        from attnscope.views.browser import render_png

        render_png(html, out, width=args.width, caption=args.caption)
    else:
        try:
            out.write_text(html, encoding="utf-8")
        except OSError as exc:
            raise AttnscopeError(f"cannot write {out}: {exc.strerror or exc}") from exc
    size = out.stat().st_size
    what = f"figure of the {args.view} view" if figure else f"{args.view} view{'s' if args.view == 'all' else ''}"
    shown = _shape(tr, (args.attention or "encoder") if figure else None)
    print(f"wrote {out}: {what} of {shown} ({size / 1e6:.2f} MB, {fmt})")
    return 0


def _traced(args: argparse.Namespace) -> Trace | EncoderDecoderTrace:
    """The trace to show: an encoder-decoder's three kinds (SOURCE, --target or generated) or one trace."""
    if args.attention is not None or args.pair is not None:  # one line before tracing, as check and explain do
        from attnscope import families

        m = model_of(args)
        if args.attention is not None:
            require_encoder_decoder(m, "--attention")
        elif families.is_encoder_decoder(m.model):
            raise AttnscopeError(f"--pair is a second sentence for an encoder or decoder: {m.name} "
                                 f"({m.architecture}) is an encoder-decoder model, so give the source as TEXT and "
                                 "the target with --target (drop --pair)")
    return traced_any(args)


def _size(tr: Trace | EncoderDecoderTrace, layers: list[int] | None, heads: list[int] | None, neuron: str,
          word_level: bool) -> PageSize:
    from attnscope.records.trace import EncoderDecoderTrace

    if isinstance(tr, EncoderDecoderTrace):
        if word_level:
            raise AttnscopeError("--word-level is not available for an encoder-decoder model's page: drop it")
        return family_page_size(tr.kinds, layers, heads, neuron)
    return page_size(tr, layers, heads, neuron, word_level)


def _shape(tr: Trace | EncoderDecoderTrace, attention: str | None) -> str:
    """What the page or figure (of one kind: `attention`) shows, for the line the command prints."""
    from attnscope.records.trace import EncoderDecoderTrace

    if not isinstance(tr, EncoderDecoderTrace):
        return f"{tr.n_tokens} tokens, {tr.n_layers} layers x {tr.n_heads} heads"
    if attention is not None:  # a figure: one kind
        k = tr.kinds[attention]
        tokens = {"encoder": f"{k.n_tokens} source", "decoder": f"{k.n_tokens} target",
                  "cross": f"{k.n_tokens} target x {k.n_keys} source"}[attention]
        return f"{ATTENTION_LABELS[attention]}, {tokens} tokens, {k.n_layers} layers x {k.n_heads} heads"
    return (f"{tr.encoder.n_tokens} source -> {tr.decoder.n_tokens} target tokens "
            f"({'generated greedily' if tr.generated else 'teacher-forced'}), encoder, decoder and cross attention")
