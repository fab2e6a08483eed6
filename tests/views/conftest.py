"""Views fixtures: a short real trace, one headless Chromium per module, pages opened from files."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import attnscope
from attnscope.tracing.one_pass import Trace, trace
from tests.support.pages import Watched, open_file

ROOT = "attnscope-root"  # what every views page draws into (views.browser.READY)

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



@pytest.fixture(scope="module")
def open_page(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Watched]:
    """open_page(html, name, width=1200, color_scheme="light") -> Watched (tests.support.pages.open_file), loaded
    from file:// and drawn."""
    folder = tmp_path_factory.mktemp("pages")

    def open_(html: str, name: str, width: int = 1200, color_scheme: str = "light") -> Watched:
        return open_file(browser, html, folder / f"{name}.html", [ROOT], width, color_scheme)

    return open_
