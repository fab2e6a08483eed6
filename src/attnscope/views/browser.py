"""Headless Chromium through Playwright: PNG pictures of pages (the CLI), and the browser the tests drive.

Playwright is the `views` extra. Its own browser download is not needed: Debian's chromium
(or ATTNSCOPE_CHROMIUM) is used when present.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from attnscope.errors import AttnscopeError

CHROMIUM_ARGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic",
)
READY = "#attnscope-root[data-attnscope-ready]"
# A picture is a figure: the controls, tabs and how-to hints give way to one caption of what is shown
# (the selected layer and heads, read from the controls before they are hidden; none when `captioned` is false);
# legends and notes stay.
AS_FIGURE = """(captioned) => {
  const panel = document.querySelector(".as-panel:not([hidden])") || document;
  const pick = (label) => panel.querySelector(`select[aria-label^="${label}"]`);
  const chips = [...panel.querySelectorAll(".as-chip[aria-pressed=true]")].map((c) => c.dataset.head);
  const parts = [];
  const kind = panel.querySelector("select.as-attention") || document.querySelector("select.as-attention");
  if (kind) parts.push(kind.selectedOptions[0].textContent);  // an encoder-decoder page: which attention
  if (pick("layer")) parts.push(`layer ${pick("layer").value}`);
  if (chips.length) parts.push(`head${chips.length > 1 ? "s" : ""} ${chips.join(", ")}`);
  if (pick("query")) parts.push(`query ${pick("query").selectedOptions[0].textContent}`);
  const caption = document.createElement("p");
  caption.className = "as-figure-caption";
  caption.textContent = parts.length ? `${parts.join(" · ")} (0-indexed)` : "";
  if (captioned !== false) panel.prepend(caption);
  document.body.classList.add("as-figure");
}"""


def chromium_path() -> str | None:
    """ATTNSCOPE_CHROMIUM, else a system chromium; None lets Playwright use its own download."""
    given = os.environ.get("ATTNSCOPE_CHROMIUM")
    if given:
        return given
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (playwright Browser), closed on exit."""
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError as exc:
        raise AttnscopeError("pictures need Playwright: pip install 'attnscope[views]'") from exc
    with sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=chromium_path(), args=list(CHROMIUM_ARGS))
        except Error as exc:
            raise AttnscopeError(
                "cannot start Chromium: install it (apt-get install chromium) or set ATTNSCOPE_CHROMIUM "
                f"to its path ({str(exc).splitlines()[0]})"
            ) from exc
        try:
            yield browser
        finally:
            browser.close()


PNG_WIDTHS = (320, 7680)  # the page's width in CSS pixels: a phone's to an 8K screen's


def render_png(document: str, path: str | os.PathLike[str], width: int = 1280, timeout_s: float = 60.0,
               caption: bool = True) -> Path:
    """Open `document` from a file in headless Chromium, wait until the views are drawn, save a full-page PNG.

    width: the page's width in CSS pixels, within PNG_WIDTHS. caption: False leaves out the line saying what is
    shown. Runs in its own thread: Playwright's sync API refuses a thread with an asyncio loop (Jupyter) or another
    Playwright session.
    """
    low, high = PNG_WIDTHS
    if not low <= width <= high:
        raise AttnscopeError(f"width {width} is out of range: use {low}..{high} pixels", parameter="width")
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(_render_png, document, Path(path), width, timeout_s, caption).result()


def _render_png(document: str, out: Path, width: int, timeout_s: float, caption: bool) -> Path:
    with tempfile.TemporaryDirectory(prefix="attnscope-") as tmp, chromium() as browser:
        page_file = Path(tmp) / "view.html"
        page_file.write_text(document, encoding="utf-8")
        page = browser.new_page(viewport={"width": width, "height": 900})
        page.goto(page_file.as_uri())
        page.wait_for_selector(READY, state="attached", timeout=timeout_s * 1000)
        page.evaluate(AS_FIGURE, caption)
        try:
            page.screenshot(path=str(out), full_page=True)
        except OSError as exc:
            raise AttnscopeError(f"cannot write {out}: {exc.strerror or exc}") from exc
    return out
