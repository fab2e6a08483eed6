"""The web app's query/key map and heads tests share a tiny real corpus: the first sentences of the bundled UD English
EWT dev slice and one hostile sentence of our own (markup as words: it must only ever show up as text), a MiniLM
index of it (layers 0 and 5, heads 1 and 4, 0-indexed) and a MiniLM heads pass over it."""

from __future__ import annotations

from pathlib import Path

import attnscope
from attnscope.corpus.heads import head_pass
from attnscope.corpus.index import build_index
from attnscope.corpus.tags import TaggedSource
from attnscope.stats.settings import Settings

LAYERS, HEADS = (0, 5), (1, 4)
SENTENCES = 10  # of the UD slice; then HOSTILE
HOSTILE = "The <img src=x onerror=alert(1)> tag <script>alert(2)</script> ran ."  # the source joins words by spaces
_ROWS = [  # id, form, upos, head, deprel
    (1, "The", "DET", 5, "det"), (2, "<img", "X", 5, "compound"), (3, "src=x", "X", 5, "compound"),
    (4, "onerror=alert(1)>", "X", 5, "compound"), (5, "tag", "NOUN", 7, "nsubj"),
    (6, "<script>alert(2)</script>", "X", 5, "appos"), (7, "ran", "VERB", 0, "root"), (8, ".", "PUNCT", 7, "punct"),
]


def corpus(ud_dev: Path, out: Path) -> Path:
    """OUT: a CoNLL-U file of the UD slice's first SENTENCES sentences, then HOSTILE."""
    blocks = ud_dev.read_text(encoding="utf-8").split("\n\n")[:SENTENCES]
    rows = [f"{i}\t{form}\t_\t{upos}\t_\t_\t{head}\t{rel}\t_\t_" for i, form, upos, head, rel in _ROWS]
    hostile = "\n".join(["# sent_id = attnscope-hostile-1", f"# text = {HOSTILE}", *rows])
    out.write_text("\n\n".join([*blocks, hostile]) + "\n\n", encoding="utf-8")
    return out


def explore_index(model: attnscope.Model, conllu: Path, out: Path) -> Path:
    """The index of the corpus in OUT (a fresh directory)."""
    return build_index(TaggedSource(str(conllu)), out, model, layers=LAYERS, heads=HEADS,
                       settings=Settings(batch_size=6)).path


def explore_heads(model: attnscope.Model, conllu: Path, out: Path) -> Path:
    """The heads pass over the corpus into OUT; returns OUT."""
    head_pass(TaggedSource(str(conllu)), out, model, settings=Settings(max_length=64, batch_size=6))
    return out
