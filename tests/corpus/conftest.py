"""Fixtures of the corpus-explorer tests: one small real index (MiniLM on the first 40 UD EWT dev sentences)."""

from __future__ import annotations

from pathlib import Path

import pytest

import attnscope
from attnscope.corpus.index import BuildResult, build_index
from attnscope.corpus.store import CorpusIndex
from attnscope.corpus.tags import TaggedSource
from attnscope.stats.settings import Settings
from tests.support.corpus import DOCUMENTS, HEADS, LAYERS


@pytest.fixture(scope="session")
def built(minilm: attnscope.Model, ud_dev: Path, tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    """The index every search test reads (read-only): layers 0 and 3, heads 1 and 4, with the FAISS index."""
    out = tmp_path_factory.mktemp("corpus") / "index"
    return build_index(TaggedSource(str(ud_dev)), out, minilm, layers=LAYERS, heads=HEADS,
                       settings=Settings(limit=DOCUMENTS, batch_size=8))


@pytest.fixture(scope="session")
def index(built: BuildResult) -> CorpusIndex:
    return CorpusIndex(built.path)

