"""Fixtures for the web app tests: one shared real `attnscope serve` on loopback for the session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from serve_support import MAX_BODY, MAX_CHARS, MAX_TOKENS, Server, start_server


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    """The shared server: the bundled model, small limits, a queue deep enough for 16 clients."""
    s = start_server("--max-tokens", str(MAX_TOKENS), "--max-chars", str(MAX_CHARS), "--max-body", str(MAX_BODY),
                     "--queue", "64")
    yield s
    assert s.stop() == 0, "".join(s.stderr)[-2000:]
    assert "Traceback" not in "".join(s.stderr), "".join(s.stderr)[-4000:]
