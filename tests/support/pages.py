"""Open a self-contained page from a file in a real Chromium, recording what it fetches, logs and pops up."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Watched:
    """A page opened from a file, with every request it made, every error it logged and every dialog it opened."""

    page: Any
    url: str
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # uncaught exceptions and console errors
    dialogs: list[str] = field(default_factory=list)  # alert(), confirm(): a script that should never run


def open_file(browser: Any, html: str, path: Path, roots: Sequence[str], width: int = 1280) -> Watched:
    """Write html to path, open it from file:// in a new page (width x 900) and wait until every root (an element
    id) has drawn (its data-attnscope-ready attribute)."""
    path.write_text(html, encoding="utf-8")
    page = browser.new_page(viewport={"width": width, "height": 900})
    seen = Watched(page, path.as_uri())
    page.on("request", lambda r: seen.requests.append(r.url))
    page.on("pageerror", lambda e: seen.errors.append(str(e)))
    page.on("console", lambda m: m.type == "error" and seen.errors.append(m.text))
    page.on("dialog", lambda d: (seen.dialogs.append(d.message), d.dismiss()))
    page.goto(seen.url)
    for root in roots:
        page.wait_for_selector(f"#{root}[data-attnscope-ready]", state="attached", timeout=60_000)
    return seen
