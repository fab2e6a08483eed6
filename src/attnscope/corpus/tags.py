"""UD annotations per word for the index: the stats reader's sentences, plus each word's UPOS.

`TaggedSource` is `attnscope.stats.sources.Source` (the same readers, the same malformed-row counting and
messages) whose CoNLL-U documents also carry the UPOS column; `Vocab` turns labels into the small integer codes
the index stores, in order of first appearance (so a resumed build gives the same codes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnscope.stats.sources import Document, Source

# The 17 universal part-of-speech tags (universaldependencies.org/u/pos), coded first in this order.
UPOS = ("ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN", "PUNCT",
        "SCONJ", "SYM", "VERB", "X")


@dataclass(frozen=True)
class TaggedDocument(Document):
    """A Document with the UPOS of each of its CoNLL-U words (None for other sources)."""

    tags: tuple[str, ...] | None = None


class TaggedSource(Source):
    """A Source whose CoNLL-U sentences keep their UPOS column."""

    def _sentence(self, path: Path, start: int, rows: list[tuple[int, list[str]]]) -> Document | None:
        doc = super()._sentence(path, start, rows)
        if doc is None:
            return None
        tags = tuple(cols[3] for _, cols in rows if "-" not in cols[0] and "." not in cols[0])
        return TaggedDocument(**{f: getattr(doc, f) for f in ("text", "where", "words", "heads", "relations")},
                              tags=tags)


def word_labels(doc: Document) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None]:
    """(UPOS, DEPREL) of each word of a document, None where the source has none."""
    tags = doc.tags if isinstance(doc, TaggedDocument) else None
    return tags, doc.relations


class Vocab:
    """Label -> code, growing in order of first appearance; -1 for no label."""

    def __init__(self, labels: list[str] | tuple[str, ...] = ()):
        self.labels = list(labels)
        self.codes = {label: i for i, label in enumerate(self.labels)}

    def code(self, label: str | None) -> int:
        if label is None:
            return -1
        if label not in self.codes:
            self.codes[label] = len(self.labels)
            self.labels.append(label)
        return self.codes[label]


__all__ = ["UPOS", "TaggedDocument", "TaggedSource", "Vocab", "word_labels"]
