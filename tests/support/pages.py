"""Open a page in a real Chromium (a self-contained file, or the web app's), recording what it fetches, logs and pops
up: the one way every browser test watches a page."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.views import ARTIFACTS


@dataclass
class Watched:
    """A page opened at url, with every request it made, every error it logged and every dialog it opened."""

    page: Any
    url: str
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # uncaught exceptions, console errors and warnings
    dialogs: list[str] = field(default_factory=list)  # alert(), confirm(): a script that should never run

    def foreign_requests(self) -> list[str]:
        """Every request but the page's own: a self-contained page makes none."""
        return [r for r in self.requests if r != self.url]

    def shot(self, name: str, folder: Path = ARTIFACTS) -> Path:
        """A full-page screenshot in folder/name.png (artifacts/views/ unless told)."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


def open_url(browser: Any, url: str, width: int = 1280, height: int = 900, color_scheme: str = "light") -> Watched:
    """Open url in a new page (width x height), every request, error, warning and dialog (dismissed) recorded from
    before it loads."""
    page = browser.new_page(viewport={"width": width, "height": height}, color_scheme=color_scheme)
    seen = Watched(page, url)
    page.on("request", lambda r: seen.requests.append(r.url))
    page.on("pageerror", lambda e: seen.errors.append(str(e)))
    page.on("console", lambda m: m.type in ("error", "warning") and seen.errors.append(m.text))
    page.on("dialog", lambda d: (seen.dialogs.append(d.message), d.dismiss()))
    page.goto(url)
    return seen


def open_file(browser: Any, html: str, path: Path, roots: Sequence[str], width: int = 1280,
              color_scheme: str = "light") -> Watched:
    """Write html to path, open it from file:// (open_url) and wait until every root (an element id) has drawn (its
    data-attnscope-ready attribute)."""
    path.write_text(html, encoding="utf-8")
    seen = open_url(browser, path.as_uri(), width, color_scheme=color_scheme)
    for root in roots:
        seen.page.wait_for_selector(f"#{root}[data-attnscope-ready]", state="attached", timeout=60_000)
    return seen


def open_app(browser: Any, url: str, width: int = 1400, height: int = 1000) -> Watched:
    """The web app's page at url (open_url), once it has loaded its models (#sv-status ok)."""
    seen = open_url(browser, url, width, height)
    seen.page.wait_for_selector("#sv-status[data-kind=ok]", timeout=60_000)
    return seen


def trace_in_app(page: Any, text: str, view: str | None = None, pair: str | None = None) -> None:
    """Trace text in the web app's page and wait until the views show it; view: head, matrix, ... first (None: the
    one shown); pair: the second segment ("": none; None: the field left as it is)."""
    page.fill("#sv-text", text)
    if pair is not None:
        page.fill("#sv-pair", pair)
    if view is not None:
        page.select_option("#sv-view", view)
    page.click("#sv-go")
    page.wait_for_function("(want) => document.querySelector('#sv-views .as-title')?.textContent === want",
                           arg=f"{text}  ‖  {pair}" if pair else text, timeout=60_000)


def click_matrix_cell(page: Any, query: int, key: int) -> None:
    """Click the web app's matrix view at (query, key), 0-indexed: the canvas names its cell size and label margin."""
    canvas = page.locator("#sv-views canvas.as-matrix")
    cell, label = (float(canvas.get_attribute(f"data-{k}")) for k in ("cell", "label"))
    canvas.click(position={"x": label + (key + 0.5) * cell, "y": label + (query + 0.5) * cell})


# Every element of a box whose right edge passes the box's, unless a scroll box of its own inside it holds it; and
# how far the box and the page scroll sideways.
_SPILLS = """(id) => {
  const box = document.getElementById(id);
  const right = box.getBoundingClientRect().right;
  const out = [];
  for (const e of box.querySelectorAll("*")) {
    const r = e.getBoundingClientRect();
    if (!r.width || r.right <= right + 1) continue;
    let held = false;
    for (let p = e.parentElement; p && p !== box; p = p.parentElement) {
      if (["auto", "scroll"].includes(getComputedStyle(p).overflowX) && p.getBoundingClientRect().right <= right + 1) {
        held = true;
        break;
      }
    }
    if (!held) out.push(`${e.tagName}.${e.getAttribute("class")} +${Math.round(r.right - right)}px`);
  }
  return { spills: out.slice(0, 5), sideways: box.scrollWidth - box.clientWidth,
           page: document.documentElement.scrollWidth - window.innerWidth };
}"""


def spills(page: Any, element_id: str) -> dict[str, Any]:
    """What runs past the right edge of the element with this id (the first five, named), how far it scrolls
    sideways and how far the page does: {"spills": [], "sideways": 0, "page": 0} where everything fits."""
    found: dict[str, Any] = page.evaluate(_SPILLS, element_id)
    return found
