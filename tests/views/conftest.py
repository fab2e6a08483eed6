"""Views fixtures: a short real trace, one headless Chromium per module, pages opened from files."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import attnscope
from attnscope.tracing.one_pass import Trace, trace
from tests.support.views import ARTIFACTS

PAIR = ("The cat sat on the mat.", "It was tired.")


@pytest.fixture(scope="session")
def pair_trace(minilm: attnscope.Model) -> Trace:
    """A real two-sentence trace of the bundled model (14 tokens)."""
    return trace(*PAIR, model=minilm)


# One Chromium per test module: Playwright's sync API allows one session per thread, and other
# modules (tests/views/test_views_beyond.py) start their own.
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from attnscope.views.browser import chromium

    with chromium() as b:
        yield b


@dataclass
class Opened:
    """A page opened from a file, with everything it asked the network for and every error it logged."""

    page: Any
    url: str
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)  # alert(), confirm(): a script that should never run

    def foreign_requests(self) -> list[str]:
        return [r for r in self.requests if r != self.url]

    def shot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture(scope="module")
def open_page(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Opened]:
    """open_page(html, name, width=1200) -> Opened, loaded from file:// and drawn."""
    from attnscope.views.browser import READY

    folder = tmp_path_factory.mktemp("pages")

    def open_(html: str, name: str, width: int = 1200, color_scheme: str = "light") -> Opened:
        path = folder / f"{name}.html"
        path.write_text(html, encoding="utf-8")
        page = browser.new_page(viewport={"width": width, "height": 900}, color_scheme=color_scheme)
        opened = Opened(page, path.as_uri())
        page.on("request", lambda r: opened.requests.append(r.url))
        page.on("console", lambda m: m.type in ("error", "warning") and opened.errors.append(m.text))
        page.on("pageerror", lambda e: opened.errors.append(str(e)))
        page.on("dialog", lambda d: (opened.dialogs.append(d.message), d.dismiss()))
        page.goto(opened.url)
        page.wait_for_selector(READY, state="attached", timeout=60_000)
        return opened

    return open_
