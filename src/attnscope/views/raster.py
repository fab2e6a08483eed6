"""SVG documents -> PNG files through headless Chromium (views.browser), for reports that write both.

Each SVG is drawn alone on a page of exactly its size (width and height read from its root element) at `scale`
device pixels per SVG pixel, so a PNG is (width x scale) by (height x scale) pixels. One browser serves every
file; like views.browser.render_png it runs in a thread of its own (Playwright's sync API refuses a thread that
has an asyncio loop, as Jupyter's has).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from attnscope.errors import AttnscopeError

_SIZE = re.compile(r'<svg\b[^>]*?\swidth="(\d+(?:\.\d+)?)"[^>]*?\sheight="(\d+(?:\.\d+)?)"')


def svg_size(svg: str) -> tuple[int, int]:
    """(width, height) in SVG pixels, from the root element's width and height attributes."""
    found = _SIZE.search(svg)
    if found is None:
        raise AttnscopeError("an SVG without width and height attributes cannot be rasterised at a known size")
    return round(float(found.group(1))), round(float(found.group(2)))


def svgs_to_png(items: Sequence[tuple[str, Path]], scale: float = 2.0, timeout_s: float = 60.0) -> list[Path]:
    """Write each (svg, path) as a PNG of svg_size(svg) x scale pixels; returns the paths."""
    if not 0.25 <= scale <= 8:
        raise AttnscopeError(f"scale {scale} is out of range: use 0.25..8", parameter="scale")
    sizes = [svg_size(svg) for svg, _ in items]  # a malformed SVG is refused before a browser starts
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(_render, items, sizes, scale, timeout_s).result()


def _render(items: Sequence[tuple[str, Path]], sizes: list[tuple[int, int]], scale: float,
            timeout_s: float) -> list[Path]:
    from attnscope.views.browser import chromium

    out = []
    with chromium() as browser:
        for (svg, path), (width, height) in zip(items, sizes, strict=True):
            page = browser.new_page(viewport={"width": width, "height": height}, device_scale_factor=scale)
            page.set_default_timeout(timeout_s * 1000)
            page.set_content("<!doctype html><html><head><style>html,body{margin:0;padding:0;background:#fff}"
                             f"svg{{display:block}}</style></head><body>{svg}</body></html>")
            try:
                page.screenshot(path=str(path), clip={"x": 0, "y": 0, "width": width, "height": height})
            except OSError as exc:
                raise AttnscopeError(f"cannot write {path}: {exc.strerror or exc}") from exc
            page.close()
            out.append(path)
    return out
