"""What the corpus-explorer tests share: the small index's choices, and the CLI as a fresh process."""

from __future__ import annotations

import sys

LAYERS, HEADS = (0, 3), (1, 4)  # the shared index keeps these (0-indexed)
DOCUMENTS = 40  # the first 40 sentences of the UD EWT dev slice


def cli(*args: str) -> list[str]:
    """`attnscope ARGS...` as a fresh process."""
    return [sys.executable, "-m", "attnscope.cli.main", *args]
