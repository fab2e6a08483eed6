"""A faithfulness run's checkpoint, safe against SIGKILL at any instant.

Per-example rows are appended to OUTDIR/rows.jsonl, flushed and fsynced; then OUTDIR/checkpoint.json is
replaced atomically (written to a .tmp, os.replace) with the run's identity, how many source documents are
done and the byte length of rows.jsonl at that point. A resume truncates rows.jsonl to that length (rows a
killed run appended after its last checkpoint are dropped and recomputed) and skips the documents done, so
it writes exactly what an uninterrupted run writes. The identity is compared as `attnscope stats` compares its
own (attnscope.stats.checkpoint.differences): a difference is named in one line.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnscope.errors import AttnscopeError
from attnscope.stats.checkpoint import differences

FILE = "checkpoint.json"
ROWS = "rows.jsonl"


@dataclass(frozen=True, kw_only=True)
class Position:
    """Where a run is: source documents done, examples measured and skipped, bytes of rows.jsonl."""

    documents: int = 0
    examples: int = 0
    skipped: int = 0
    bytes: int = 0
    complete: bool = False


def save(outdir: Path, identity: dict[str, Any], position: Position) -> None:
    """Write the checkpoint atomically (a kill mid-write leaves the previous one)."""
    data = {"identity": identity, "documents": position.documents, "examples": position.examples,
            "skipped": position.skipped, "bytes": position.bytes, "complete": position.complete}
    tmp = outdir / (FILE + ".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, outdir / FILE)


def load(outdir: Path) -> tuple[dict[str, Any], Position]:
    path = outdir / FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return data["identity"], Position(documents=int(data["documents"]), examples=int(data["examples"]),
                                          skipped=int(data["skipped"]), bytes=int(data["bytes"]),
                                          complete=bool(data["complete"]))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise AttnscopeError(f"cannot read {path} as a faithfulness checkpoint ({exc}): choose another output "
                             "directory") from exc


def start(outdir: Path, identity: dict[str, Any], resume: bool) -> Position:
    """The position to continue from; without resume a non-empty outdir is refused, with it another run's."""
    if not resume or not (outdir / FILE).is_file():
        if outdir.exists() and (not outdir.is_dir() or any(outdir.iterdir())):
            hint = ("pass resume=True to continue that run, or choose another outdir" if not resume else
                    f"it has no {FILE} to resume from: choose another outdir")
            raise AttnscopeError(f"{outdir} already exists and is not empty: {hint}", parameter="resume")
        try:
            outdir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise AttnscopeError(f"cannot create the output directory {outdir}: {exc.strerror or exc}: choose "
                                 "another outdir") from exc
        (outdir / ROWS).write_bytes(b"")
        return Position()
    then, position = load(outdir)
    changed = differences(then, json.loads(json.dumps(identity)))
    if changed:
        raise AttnscopeError(f"{outdir / FILE} is from a run with other arguments ({changed}): resume with the "
                             "same arguments, or choose another outdir")
    with (outdir / ROWS).open("r+b") as handle:  # drop rows appended after the checkpoint
        handle.truncate(position.bytes)
    return position


def append(outdir: Path, rows: list[dict[str, Any]]) -> int:
    """Append rows (one JSON line each), fsynced; the new byte length of rows.jsonl."""
    with (outdir / ROWS).open("ab") as handle:
        for row in rows:
            handle.write(json.dumps(row, allow_nan=True).encode("utf-8") + b"\n")
        handle.flush()
        os.fsync(handle.fileno())
        return handle.tell()


def read_rows(outdir: Path) -> list[dict[str, Any]]:
    with (outdir / ROWS).open("rb") as handle:
        return [json.loads(line) for line in handle if line.strip()]
