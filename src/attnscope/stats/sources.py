"""Corpus readers: each yields Documents in a fixed order, streaming, and reports malformed rows.

Formats: plain text (one document per line), .jsonl (--field), .csv / .tsv (--column),
.parquet (--column), a directory of .txt files (one document per file), CoNLL-U (one
sentence per document, with its gold dependency tree) and `sklearn:20newsgroups[:train|:test]`.
A malformed row is logged with file:line and skipped, or raises with strict=True.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import logging
import re
import socket
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnscope.errors import AttnscopeError
from attnscope.numbers import is_count

log = logging.getLogger(__name__)

NEWSGROUPS = "sklearn:20newsgroups"
_NEWSGROUPS_HOST = ("ndownloader.figshare.com", 443)
_CONLLU_SUFFIXES = (".conllu", ".conll")


@dataclass(frozen=True)
class Document:
    """One document of a corpus. CoNLL-U sentences also carry their gold tree over `words`."""

    text: str
    where: str  # "file:line" (or "source:index") for messages
    words: tuple[str, ...] | None = None  # CoNLL-U word forms; text is them joined by single spaces
    heads: tuple[int, ...] | None = None  # gold head of each word, 1-based, 0 = root
    relations: tuple[str, ...] | None = None  # DEPREL of each word


@dataclass
class Source:
    """A corpus to read; iterate it (again and again) for its Documents in the same order."""

    spec: str
    field: str | None = None  # .jsonl
    column: str | None = None  # .csv / .tsv / .parquet
    strict: bool = False
    malformed: int = 0  # rows skipped in the last full read
    kind: str = dataclasses.field(default="", init=False)
    quiet: bool = dataclasses.field(default=False, init=False)

    def __post_init__(self) -> None:
        self.kind = source_kind(self.spec)

    def __iter__(self) -> Iterator[Document]:
        self.malformed = 0
        readers = {
            "text": self._text,
            "jsonl": self._jsonl,
            "csv": self._csv,
            "parquet": self._parquet,
            "directory": self._directory,
            "conllu": self._conllu,
            "newsgroups": self._newsgroups,
        }
        yield from readers[self.kind]()

    @property
    def has_trees(self) -> bool:
        return self.kind == "conllu"

    def count(self, limit: int | None = None) -> int:
        """How many documents a run will read (a quiet pass: malformed rows are reported by the run)."""
        self.quiet = True
        try:
            return sum(1 for _ in itertools.islice(self, limit))
        finally:
            self.quiet = False

    def describe(self) -> dict[str, Any]:
        return {"spec": self.spec, "kind": self.kind, "field": self.field, "column": self.column}

    def bad(self, where: str, why: str, what: str = "row") -> None:
        """Report one malformed row (or sentence): fatal with strict, else logged and counted."""
        if self.strict:
            raise AttnscopeError(f"{where}: {why} (strict=True makes malformed rows fatal)")
        self.malformed += 1
        if not self.quiet:
            log.warning("%s: %s; %s skipped", where, why, what)

    def _text(self) -> Iterator[Document]:
        path = Path(self.spec)
        for number, line in _lines(path):
            text = line.rstrip("\r\n")
            if text.strip():
                yield Document(text, f"{path}:{number}")

    def _jsonl(self) -> Iterator[Document]:
        path, name = Path(self.spec), self.field or "text"
        for number, line in _lines(path):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                self.bad(where, f"not valid JSON ({exc.msg})")
                continue
            text = row.get(name) if isinstance(row, dict) else None
            if self._usable(where, text, f"field {name!r}"):
                yield Document(str(text), where)

    def _csv(self) -> Iterator[Document]:
        path = Path(self.spec)
        delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
        with _open(path) as handle:
            reader = csv.reader((line for _, line in numbered_lines(handle, str(path))), delimiter=delimiter)
            header = next(reader, None)
            if header is None:
                return
            index = _column_index(path, header, self.column)
            for row in reader:
                where = f"{path}:{reader.line_num}"
                if not row:
                    continue
                if len(row) != len(header):
                    self.bad(where, f"{len(row)} fields where the header has {len(header)}")
                    continue
                if self._usable(where, row[index], f"column {header[index]!r}"):
                    yield Document(row[index], where)

    def _parquet(self) -> Iterator[Document]:
        import pyarrow.parquet as pq

        path = Path(self.spec)
        try:
            pf = pq.ParquetFile(path)
        except Exception as exc:  # pyarrow raises several types for unreadable files
            raise AttnscopeError(f"cannot read {path} as parquet: {exc}") from exc
        names = list(pf.schema_arrow.names)
        name = names[_column_index(path, names, self.column)]
        row_number = 0
        for batch in pf.iter_batches(columns=[name], batch_size=4096):
            for value in batch.column(0).to_pylist():
                row_number += 1
                where = f"{path}:row {row_number}"
                if self._usable(where, value, f"column {name!r}"):
                    yield Document(str(value), where)

    def _directory(self) -> Iterator[Document]:
        for path in sorted(Path(self.spec).glob("*.txt")):
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                self.bad(str(path), "not UTF-8 text")
                continue
            if self._usable(str(path), text, "the file"):
                yield Document(text, str(path))

    def _conllu(self) -> Iterator[Document]:
        path = Path(self.spec)
        for start, rows in _conllu_sentences(path):
            doc = self._sentence(path, start, rows)
            if doc is not None:
                yield doc

    def _sentence(self, path: Path, start: int, rows: list[tuple[int, list[str]]]) -> Document | None:
        words: list[str] = []
        heads: list[int] = []
        relations: list[str] = []
        for number, cols in rows:
            where = f"{path}:{number}"
            if len(cols) != 10:
                self.bad(where, f"{len(cols)} tab-separated fields, CoNLL-U has 10", "sentence")
                return None
            if "-" in cols[0] or "." in cols[0]:
                continue  # multi-word token ranges (3-4) and empty nodes (5.1) are not words
            if cols[0] != str(len(words) + 1) or not is_count(cols[6]):
                self.bad(where, f"word ID {cols[0]!r} out of sequence or HEAD {cols[6]!r} not a number", "sentence")
                return None
            words.append(cols[1])
            heads.append(int(cols[6]))
            relations.append(cols[7])
        if not words:
            return None
        if any(h > len(words) for h in heads):
            self.bad(f"{path}:{start}", "a HEAD points past the last word", "sentence")
            return None
        return Document(" ".join(words), f"{path}:{start}", tuple(words), tuple(heads), tuple(relations))

    def _newsgroups(self) -> Iterator[Document]:
        subset = self.spec.split(":")[2] if self.spec.count(":") == 2 else "train"
        for index, text in enumerate(_fetch_newsgroups(subset)):
            where = f"{NEWSGROUPS}:{subset}:{index}"
            if self._usable(where, text, "the post"):
                yield Document(text, where)

    def _usable(self, where: str, text: Any, what: str) -> bool:
        if not isinstance(text, str):
            self.bad(where, f"{what} is missing or not a string")
            return False
        if not text.strip():
            self.bad(where, f"{what} is empty")
            return False
        return True


def source_kind(spec: str) -> str:
    """What reader a SOURCE argument needs, or a one-line error saying what is accepted."""
    if spec.startswith("sklearn:"):
        if spec not in (NEWSGROUPS, f"{NEWSGROUPS}:train", f"{NEWSGROUPS}:test"):
            raise AttnscopeError(f"unknown source {spec!r}: use {NEWSGROUPS}, {NEWSGROUPS}:train or :test")
        return "newsgroups"
    path = Path(spec)
    if not path.exists():
        raise AttnscopeError(f"source {spec} does not exist: give a file, a directory of .txt, or {NEWSGROUPS}")
    if path.is_dir():
        return "directory"
    suffix = path.suffix.lower()
    kinds = {".jsonl": "jsonl", ".csv": "csv", ".tsv": "csv", ".parquet": "parquet"}
    if suffix in _CONLLU_SUFFIXES:
        return "conllu"
    return kinds.get(suffix, "text")


def _open(path: Path) -> Any:
    """The file as bytes: lines are decoded one by one, so a decoding error names its own line."""
    try:
        return path.open("rb")
    except OSError as exc:
        raise AttnscopeError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, line) of a UTF-8 file; a non-UTF-8 line is one clear error."""
    with _open(path) as handle:
        yield from numbered_lines(handle, str(path))


_LONE_CR = re.compile(r"(?<=\r)(?!\n)")  # the split after a "\r" that is not part of "\r\n"


def numbered_lines(handle: Iterable[bytes], name: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, line with its ending) of a binary UTF-8 handle, lines ending in "\n", "\r\n"
    or "\r" as in text mode with newline=""; a line that is not UTF-8 raises naming the file and that line."""
    number = 0
    for raw in handle:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad = number + 1 + raw.count(b"\r", 0, exc.start) - raw.count(b"\r\n", 0, exc.start)
            raise AttnscopeError(f"{name}:{bad}: not UTF-8 text (re-save the file as UTF-8)") from exc
        for line in _LONE_CR.split(text) if "\r" in text else (text,):
            if line:
                number += 1
                yield number, line


def _column_index(path: Path, names: list[str], wanted: str | None) -> int:
    if wanted is not None:
        if wanted not in names:
            raise AttnscopeError(f"{path} has no column {wanted!r}: its columns are {', '.join(names)}")
        return names.index(wanted)
    if "text" in names:
        return names.index("text")
    if len(names) == 1:
        return 0
    raise AttnscopeError(f"{path} has several columns ({', '.join(names)}): choose one with column=NAME",
                         parameter="column")


def _conllu_sentences(path: Path) -> Iterator[tuple[int, list[tuple[int, list[str]]]]]:
    """(first line number, [(line number, fields)]) per sentence; comments are dropped."""
    rows: list[tuple[int, list[str]]] = []
    start = 0
    for number, line in _lines(path):
        text = line.rstrip("\r\n")
        if not text.strip():
            if rows:
                yield start, rows
            rows = []
            continue
        if text.startswith("#"):
            continue
        if not rows:
            start = number
        rows.append((number, text.split("\t")))
    if rows:
        yield start, rows


def _fetch_newsgroups(subset: str) -> list[str]:
    """20 Newsgroups through scikit-learn: its cache, else a download, else a fast clear error."""
    try:
        from sklearn.datasets import fetch_20newsgroups
    except ImportError as exc:
        raise AttnscopeError("sklearn:20newsgroups needs scikit-learn: pip install 'attnscope[stats]'") from exc
    try:
        data: Any = fetch_20newsgroups(subset=subset, download_if_missing=False, shuffle=False)
        return list(data.data)
    except OSError:
        log.info("20 Newsgroups is not in scikit-learn's cache; downloading it")
    if not _reachable(*_NEWSGROUPS_HOST):
        raise AttnscopeError(
            "20 Newsgroups is not cached and its download server cannot be reached (offline?): "
            "run once with network, or give a local corpus file"
        )
    try:
        data = fetch_20newsgroups(subset=subset, shuffle=False, n_retries=1)
    except Exception as exc:  # urllib, tarfile and OS errors from the download
        raise AttnscopeError(f"could not download 20 Newsgroups: {exc}") from exc
    return list(data.data)


def _reachable(host: str, port: int, timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False

