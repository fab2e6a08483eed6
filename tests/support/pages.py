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

    def shot(self, name: str) -> Path:
        """A full-page screenshot in artifacts/views/name.png."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
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
