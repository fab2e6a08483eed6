"""What the corpus-explorer tests share: the small index's choices, and the CLI with the corpus commands."""

from __future__ import annotations

import sys

LAYERS, HEADS = (0, 3), (1, 4)  # the shared index keeps these (0-indexed)
DOCUMENTS = 40  # the first 40 sentences of the UD EWT dev slice
CLI_MODULE = "attnscope.cli.corpus"


def cli(*args: str) -> list[str]:
    """`attnscope ARGS...` as a fresh process, with the corpus commands registered (main.py may not list them yet)."""
    code = ("import sys; from attnscope.cli import main as m; "
            f"m.COMMAND_MODULES = tuple(dict.fromkeys((*m.COMMAND_MODULES, {CLI_MODULE!r}))); sys.exit(m.main())")
    return [sys.executable, "-c", code, *args]
