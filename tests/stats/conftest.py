"""Fixtures of the corpus-statistics tests: the real UD English EWT dev set, read in place."""

from __future__ import annotations

from pathlib import Path

import pytest

UD_DEV = Path(__file__).resolve().parents[3] / "shared" / "data" / "ud-english-ewt" / "en_ewt-ud-dev.conllu"


@pytest.fixture(scope="session")
def ud_dev() -> Path:
    if not UD_DEV.is_file():
        pytest.fail(f"the UD English EWT dev set is missing: expected it at {UD_DEV}")
    return UD_DEV
