"""Documents for a Ray run: text, .jsonl and .parquet files are read by Ray Data tasks; the rest by attnscope.

Ray Data streams the file's rows, in order and read on the driver's node (where the file is),
to the driver, which turns them into Documents with the same rules, messages and line numbers
as `attnscope.stats.sources.Source`; both engines then batch them on one path
(attnscope.stats.batching.numbered_batches), so they bucket the same documents into the same
batches. Lines are split as Python's universal newlines do (not str.splitlines, which Ray's own
read_text uses and which also splits at form feeds and U+2028), so no document changes.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import ray.data
import ray.util.client
from ray.data.datasource import FileBasedDatasource
from ray.exceptions import RayTaskError

from attnscope.errors import AttnscopeError
from attnscope.stats.sources import Document, Source, numbered_lines

RAY_DATA_KINDS = ("text", "jsonl", "parquet")
_ROWS_PER_BLOCK = 8192


class CorpusFile(FileBasedDatasource):  # type: ignore[misc]
    """One corpus file as blocks of (number, value): line numbers and lines, or parquet row numbers and values."""

    def __init__(self, path: str, kind: str, column: str | None = None):
        super().__init__(path)
        self.kind, self.column = kind, column

    def _read_stream(self, f: Any, path: str) -> Iterator[pa.Table]:
        rows = self._parquet(path) if self.kind == "parquet" else self._lines(f, path)
        numbers: list[int] = []
        values: list[Any] = []
        for number, value in rows:
            numbers.append(number)
            values.append(value)
            if len(numbers) == _ROWS_PER_BLOCK:
                yield _block(numbers, values)
                numbers, values = [], []
        if numbers:
            yield _block(numbers, values)

    def _lines(self, f: Any, path: str) -> Iterator[tuple[int, str]]:
        return numbered_lines(io.BufferedReader(f), path)  # pyarrow streams have no readline of their own

    def _parquet(self, path: str) -> Iterator[tuple[int, Any]]:
        number = 0
        for batch in pq.ParquetFile(path).iter_batches(columns=[self.column], batch_size=4096):
            for value in batch.column(0).to_pylist():
                number += 1
                yield number, value


def _block(numbers: list[int], values: list[Any]) -> pa.Table:
    strings = [v if isinstance(v, str) or v is None else json.dumps(v, default=str) for v in values]
    kinds = [isinstance(v, str) for v in values]  # False: missing or not a string (a malformed row)
    return pa.table({"number": numbers, "value": strings, "is_string": kinds})


def uses_ray_data(source: Source) -> bool:
    """Ray Data reads the file on this node; through Ray Client (ray://) this node is not in the
    cluster, so attnscope's reader reads it here and the batches travel to the workers."""
    return source.kind in RAY_DATA_KINDS and not ray.util.client.ray.is_connected()  # type: ignore[no-untyped-call]


def documents(source: Source) -> Iterator[Document]:
    """The source's Documents in order: through Ray Data where the format allows, else its own reader."""
    if not uses_ray_data(source):
        yield from source
        return
    source.malformed = 0
    path = Path(source.spec)
    column = _parquet_column(path, source.column) if source.kind == "parquet" else None
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # the local engine's chunks need the file's order
    context.enable_progress_bars = False  # the library never prints: the CLI shows its own progress
    for block in _blocks(path, source.kind, column):
        for number, value, is_string in zip(block.column("number").to_pylist(), block.column("value").to_pylist(),
                                            block.column("is_string").to_pylist(), strict=True):
            doc = _document(source, path, column, int(number), value if is_string else None)
            if doc is not None:
                yield doc


def _blocks(path: Path, kind: str, column: str | None) -> Iterator[pa.Table]:
    """The file's rows in order; read tasks run on this node (where the file is), needing no CPU of the workers'."""
    here = {"ray.io/node-id": ray.get_runtime_context().get_node_id()}
    dataset = ray.data.read_datasource(CorpusFile(str(path.resolve()), kind, column), num_cpus=0, label_selector=here)
    ray_data_log = logging.getLogger("ray.data")
    level = ray_data_log.level
    ray_data_log.setLevel(logging.ERROR)  # its plan and progress notes would go to stderr: a library never prints
    try:
        yield from dataset.iter_batches(batch_size=None, batch_format="pyarrow")
    except RayTaskError as exc:  # a read task failed: say why in one line, without Ray's traceback
        cause = exc.cause
        first = (str(cause).strip().splitlines() or [""])[0]  # Ray appends its retry advice on later lines
        if isinstance(cause, AttnscopeError):
            raise AttnscopeError(first) from None
        raise AttnscopeError(f"Ray Data could not read {path}: {type(cause).__name__}: {first}") from None
    finally:
        ray_data_log.setLevel(level)


def _document(source: Source, path: Path, column: str | None, number: int, value: str | None) -> Document | None:
    """A row made a Document exactly as Source does (or None: blank, or malformed and reported)."""
    if source.kind == "text":
        assert value is not None
        text = value.rstrip("\r\n")
        return Document(text, f"{path}:{number}") if text.strip() else None
    if source.kind == "parquet":
        where = f"{path}:row {number}"
        if value is None:
            _missing(source, where, f"column {column!r}")
            return None
        return Document(value, where) if _usable(source, where, value, f"column {column!r}") else None
    assert value is not None
    if not value.strip():
        return None
    where, name = f"{path}:{number}", source.field or "text"
    try:
        row = json.loads(value)
    except json.JSONDecodeError as exc:
        source.bad(where, f"not valid JSON ({exc.msg})")
        return None
    field: Any = row.get(name) if isinstance(row, dict) else None
    if not isinstance(field, str):
        _missing(source, where, f"field {name!r}")
        return None
    return Document(field, where) if _usable(source, where, field, f"field {name!r}") else None


def _usable(source: Source, where: str, text: str, what: str) -> bool:
    if not text.strip():
        source.bad(where, f"{what} is empty")
        return False
    return True


def _missing(source: Source, where: str, what: str) -> None:
    source.bad(where, f"{what} is missing or not a string")


def _parquet_column(path: Path, wanted: str | None) -> str:
    """The column Source would read (same rules and messages)."""
    try:
        names: list[str] = [str(n) for n in pq.read_schema(path).names]
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise AttnscopeError(f"cannot read {path} as parquet: {exc}") from exc
    if wanted is not None:
        if wanted not in names:
            raise AttnscopeError(f"{path} has no column {wanted!r}: its columns are {', '.join(names)}")
        return wanted
    if "text" in names:
        return "text"
    if len(names) == 1:
        return names[0]
    raise AttnscopeError(f"{path} has several columns ({', '.join(names)}): choose one with column=NAME",
                         parameter="column")

