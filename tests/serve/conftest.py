"""Fixtures for the web app tests: one shared real `attnscope serve` on loopback for the session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.serve import MAX_BODY, MAX_CHARS, MAX_TOKENS, Server, start_server


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    """The shared server: the bundled model, small limits, a queue deep enough for 16 clients."""
    s = start_server("--max-tokens", str(MAX_TOKENS), "--max-chars", str(MAX_CHARS), "--max-body", str(MAX_BODY),
                     "--queue", "64")
    yield s
    assert s.stop() == 0, "".join(s.stderr)[-2000:]
    assert "Traceback" not in "".join(s.stderr), "".join(s.stderr)[-4000:]


@pytest.fixture(scope="session")
def long_server() -> Iterator[Server]:
    """Long traces (issue 16): MiniLM up to 512 tokens, 4 MiB per response, two traces kept."""
    s = start_server("--max-tokens", "512", "--max-chars", "20000", "--max-response", "4", "--cache", "2")
    yield s
    assert s.stop() == 0, "".join(s.stderr)[-2000:]
    assert "Traceback" not in "".join(s.stderr), "".join(s.stderr)[-4000:]
