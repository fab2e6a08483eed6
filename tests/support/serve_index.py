"""The web app's corpus-search tests share one tiny real index: MiniLM over the first sentences of the bundled UD
English EWT dev slice, layers 0 and 5, head 1 (0-indexed), with its FAISS index."""

from __future__ import annotations

from pathlib import Path

import attnscope
from attnscope.corpus.index import build_index
from attnscope.corpus.tags import TaggedSource
from attnscope.stats.settings import Settings

LAYERS, HEADS = (0, 5), (1,)
SENTENCES = 12


def tiny_index(model: attnscope.Model, ud_dev: Path, out: Path) -> Path:
    """Build the index into out (a fresh directory) and return it."""
    return build_index(TaggedSource(str(ud_dev)), out, model, layers=LAYERS, heads=HEADS,
                       settings=Settings(limit=SENTENCES, batch_size=6)).path
