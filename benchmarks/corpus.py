"""The corpus the benchmarks read: the repo's 500-sentence slice of UD English EWT dev, or the whole
dev set when ATTNSCOPE_UD_DEV names a copy of it (each benchmark prints which one it read)."""

from __future__ import annotations

import os
from pathlib import Path

SLICE = Path(__file__).resolve().parents[1] / "tests" / "data" / "ud-english-ewt" / "en_ewt-ud-dev-500.conllu"


def ud_dev() -> Path:
    """ATTNSCOPE_UD_DEV when set (e.g. the full 2,001-sentence dev set), else the repo's slice."""
    chosen = Path(os.environ.get("ATTNSCOPE_UD_DEV", "") or SLICE)
    if not chosen.is_file():
        raise SystemExit(f"benchmark corpus not found: {chosen} (unset ATTNSCOPE_UD_DEV to use {SLICE})")
    print(f"corpus: {chosen}")
    return chosen
