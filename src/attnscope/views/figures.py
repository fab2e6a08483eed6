"""Figures of one view for papers: SVG (vector text and lines), PNG at a chosen scale, PDF (Chromium prints the SVG).

The figure is drawn by the page's own script (assets/export.js, the same code as the page's download
buttons) in headless Chromium: the view's page is opened with its starting selection, and the SVG
that `attnscope.figureSVG` returns is written as it is, or rasterised (`figurePNG`) or printed (PDF).

    figure(trace, "out.svg", view="head", layer=2, heads=[7])  -> Path
    figure(ed_trace, "cross.svg", view="matrix", attention="cross")   an encoder-decoder's kind: target x source
    figure(trace, "m.pdf", view="matrix", caption=False)               the figure alone, for a caption of your own

Every figure is cut to what it draws (the SVG's viewBox is the drawn content's box plus a small margin, as
the browser lays it out), heatmaps carry a colour bar with their scale, and a PDF is one page of the
figure's size.
"""

from __future__ import annotations

import base64
import os
import re
import tempfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnscope.errors import AttnscopeError

if TYPE_CHECKING:
    from attnscope.records.trace import EncoderDecoderTrace, Trace

FORMATS = ("svg", "png", "pdf")
FIGURE_VIEWS = ("head", "model", "matrix", "neuron")
MAX_SCALE = 8.0


def figure_format(path: str | os.PathLike[str], fmt: str | None = None) -> str:
    """The format named by `fmt`, else by the file's suffix; a one-line error for anything else."""
    name = (fmt or Path(path).suffix.lstrip(".")).lower()
    if name not in FORMATS:
        raise AttnscopeError(f"unsupported figure format {name or Path(path).name!r}: "
                             f"name the output FILE.svg, FILE.png or FILE.pdf")
    return name


def validate_figure(view: str, scale: float) -> None:
    if view not in FIGURE_VIEWS:
        raise AttnscopeError(f"a figure shows one view: choose view from {', '.join(FIGURE_VIEWS)}, not {view!r}")
    if not 0 < scale <= MAX_SCALE:
        raise AttnscopeError(f"scale must be above 0 and at most {MAX_SCALE:g}, got {scale:g}")


def figure(
    trace: Trace | EncoderDecoderTrace,
    path: str | os.PathLike[str],
    view: str = "head",
    *,
    fmt: str | None = None,
    scale: float = 2.0,
    layers: Iterable[int] | None = None,
    heads: Iterable[int] | None = None,
    layer: int | None = None,
    head: int | None = None,
    show_heads: Iterable[int] | None = None,
    query: int | None = None,
    source: str | None = None,
    attention: str | None = None,
    caption: bool = True,
    raw_tokens: bool = False,
) -> Path:
    """Write one view of `trace` as a figure (svg, png or pdf, from fmt or the file's suffix) and return its path.

    layer, head, show_heads (heads drawn in the head view), query, source: the selection shown, 0-indexed.
    scale: PNG pixels per SVG pixel. attention: an encoder-decoder trace's kind shown, "encoder" (default),
    "decoder" or "cross" (rows the target tokens, columns the source tokens). caption: False leaves out the
    caption (model, selection, verification badge). raw_tokens: tokens as the tokenizer spells its pieces ("Ġworld")
    rather than as they read (" world").
    """
    from attnscope.views import to_html

    kind = figure_format(path, fmt)
    validate_figure(view, scale)
    document = to_html(trace, view, layers=layers, heads=heads, layer=layer, head=head, show_heads=show_heads,
                       query=query, source=source, theme="light", neuron="all" if view == "neuron" else "none",
                       attention=attention, raw_tokens=raw_tokens)
    return render_figure(document, Path(path), kind, scale, caption=caption)


def render_figure(document: str, out: Path, kind: str, scale: float = 2.0, timeout_s: float = 60.0,
                  root: str = "attnscope-root", caption: bool = True) -> Path:
    """Open a one-view page in headless Chromium and write its figure (in a thread of its own, as render_png).

    root: the id of the element the page draws into (the generation page's is "attnscope-generation-root").
    caption: False draws the figure without its caption."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(_render_figure, document, out, kind, scale, timeout_s, root, caption).result()


def _render_figure(document: str, out: Path, kind: str, scale: float, timeout_s: float, root_id: str,
                   caption: bool) -> Path:
    from attnscope.views.browser import chromium

    with tempfile.TemporaryDirectory(prefix="attnscope-") as tmp, chromium() as browser:
        page_file = Path(tmp) / "view.html"
        page_file.write_text(document, encoding="utf-8")
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(page_file.as_uri())
        page.wait_for_selector(f"#{root_id}[data-attnscope-ready]", state="attached", timeout=timeout_s * 1000)
        root = f"document.getElementById('{root_id}')"
        options = {"caption": caption}
        if kind == "png":
            url = page.evaluate(f"([s, o]) => window.attnscope.figurePNG({root}, s, null, o)", [scale, options])
            data = base64.b64decode(url.split(",", 1)[1])
        else:
            svg = page.evaluate(f"(o) => window.attnscope.figureSVG({root}, null, o)", options)
            data = svg.encode("utf-8") if kind == "svg" else _pdf(browser, svg)
        try:
            out.write_bytes(data)
        except OSError as exc:
            raise AttnscopeError(f"cannot write {out}: {exc.strerror or exc}") from exc
    return out


def _pdf(browser: Any, svg: str) -> bytes:
    """Chromium prints the SVG on one page of its own size: vector text and lines stay vectors.

    The SVG is a block (inline, it sat on a text line whose descent spilled a blank second page) on a page of
    exactly its size with no margin."""
    size = re.search(r'width="(\d+)" height="(\d+)"', svg)
    width, height = (int(size.group(1)), int(size.group(2))) if size else (800, 600)
    page = browser.new_page()
    page.set_content(f"<!doctype html><html><head><style>@page{{size:{width}px {height}px;margin:0}}"
                     "html,body{margin:0;padding:0}svg{display:block}</style></head>"
                     f"<body>{svg.split('?>', 1)[-1]}</body></html>")
    pdf: bytes = page.pdf(width=f"{width}px", height=f"{height}px", print_background=True)
    return pdf
