"""Fixtures of the corpus-explorer tests: one small real index (MiniLM on the first 40 UD EWT dev sentences)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import attnscope
from attnscope.cli import main as cli_main
from attnscope.corpus.index import BuildResult, build_index
from attnscope.corpus.store import CorpusIndex
from attnscope.corpus.tags import TaggedSource
from attnscope.stats.settings import Settings
from tests.support.corpus import CLI_MODULE, DOCUMENTS, HEADS, LAYERS


@pytest.fixture(scope="session")
def built(minilm: attnscope.Model, ud_dev: Path, tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    """The index every search test reads (read-only): layers 0 and 3, heads 1 and 4, with the FAISS index."""
    out = tmp_path_factory.mktemp("corpus") / "index"
    return build_index(TaggedSource(str(ud_dev)), out, minilm, layers=LAYERS, heads=HEADS,
                       settings=Settings(limit=DOCUMENTS, batch_size=8))


@pytest.fixture(scope="session")
def index(built: BuildResult) -> CorpusIndex:
    return CorpusIndex(built.path)


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """attnscope.cli.main with the corpus commands (until main.py's COMMAND_MODULES lists them itself)."""
    if CLI_MODULE not in cli_main.COMMAND_MODULES:
        monkeypatch.setattr(cli_main, "COMMAND_MODULES", (*cli_main.COMMAND_MODULES, CLI_MODULE))
    yield

