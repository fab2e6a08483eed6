"""The on-disk corpus index: raw little-endian arrays, one file each, named by a JSON manifest (torch-free).

An index is a directory:

    manifest.json       what it is: format and version, the model, the layers and heads (0-indexed), the corpus,
                        the settings, the UD label vocabularies, every array's file, dtype, shape and sha256,
                        the approximate index's files; and the sha256 of all of that (`checksum`)
    documents.jsonl     one JSON object per document, in the order the build wrote them
    arrays/NAME.bin     one array each, C order, little-endian, no header: np.memmap(file, dtype, "r", shape=shape)
    ann/NAME.LIBRARY    the approximate-nearest-neighbour index of a vector array (optional)
    build.json          the build's checkpoint while it runs (kept after it: a resume of a complete build is a no-op)

Per token (rows in build order): `doc` (row of documents.jsonl), `position` (token index in its document),
`token_id`, `start`/`end` (character offsets in the document's text), `special`, `word` (gold word index,
-1 none), `upos`, `deprel` (codes into the manifest's vocabularies, -1 none). Per chosen layer L:
`embedding.lL` [token, d_model], `context.lL` [token, head * d_head] (every head's context, merged),
`query.lL`, `key.lL` [token, chosen head, d_head], `entropy.lL`, `special_share.lL` [token, chosen head] and
`top_offset.lL` [token, chosen head]. Per document: `doc_offset` (byte offset of its line in documents.jsonl).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.errors import AttnscopeError

FORMAT = "attnscope-corpus-index"
VERSION = 1
MANIFEST = "manifest.json"
DOCUMENTS = "documents.jsonl"
ARRAYS = "arrays"
ANN_DIR = "ann"
BY = ("embedding", "context", "query", "key")  # what a search compares (search --by)
PER_HEAD = ("query", "key")  # vectors kept per chosen head

TOKEN_COLUMNS: dict[str, str] = {"doc": "<i4", "position": "<i4", "token_id": "<i4", "start": "<i4", "end": "<i4",
                                 "special": "|u1", "word": "<i4", "upos": "<i2", "deprel": "<i2"}


@dataclass(frozen=True, kw_only=True)
class ArraySpec:
    """One array of the index: its name, numpy dtype string, the axis its rows run over and its row shape."""

    name: str
    dtype: str
    rows: str  # "token" or "document"
    tail: tuple[int, ...] = ()

    @property
    def file(self) -> str:
        return f"{ARRAYS}/{self.name}.bin"

    @property
    def row_bytes(self) -> int:
        return int(np.dtype(self.dtype).itemsize * int(np.prod(self.tail, dtype=np.int64)))


def array_specs(layers: Iterable[int], heads: int, d_model: int, d_context: int, d_head: int) -> list[ArraySpec]:
    """Every array of an index of these layers and this many chosen heads."""
    specs = [ArraySpec(name=n, dtype=d, rows="token") for n, d in TOKEN_COLUMNS.items()]
    specs.append(ArraySpec(name="doc_offset", dtype="<i8", rows="document"))
    for layer in layers:
        specs += [
            ArraySpec(name=f"embedding.l{layer}", dtype="<f4", rows="token", tail=(d_model,)),
            ArraySpec(name=f"context.l{layer}", dtype="<f4", rows="token", tail=(d_context,)),
            ArraySpec(name=f"query.l{layer}", dtype="<f4", rows="token", tail=(heads, d_head)),
            ArraySpec(name=f"key.l{layer}", dtype="<f4", rows="token", tail=(heads, d_head)),
            ArraySpec(name=f"entropy.l{layer}", dtype="<f4", rows="token", tail=(heads,)),
            ArraySpec(name=f"special_share.l{layer}", dtype="<f4", rows="token", tail=(heads,)),
            ArraySpec(name=f"top_offset.l{layer}", dtype="<i4", rows="token", tail=(heads,)),
        ]
    return specs


def sha256_file(path: Path, block: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_checksum(manifest: dict[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON without its own checksum."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class Appender:
    """Appends rows to an index's files during a build; `sizes` and `truncate` make a checkpoint and a resume."""

    def __init__(self, root: Path, specs: list[ArraySpec]):
        self.root, self.specs = root, {s.name: s for s in specs}
        (root / ARRAYS).mkdir(parents=True, exist_ok=True)
        self.files = [*(s.file for s in specs), DOCUMENTS]

    def append(self, rows: dict[str, np.ndarray], documents: list[dict[str, Any]]) -> None:
        """One batch: every array's new rows (token and document arrays) and its documents' lines."""
        doc_path = self.root / DOCUMENTS
        start = doc_path.stat().st_size if doc_path.exists() else 0
        lines = [(json.dumps(d, ensure_ascii=False) + "\n").encode("utf-8") for d in documents]
        offsets = np.cumsum([start, *(len(line) for line in lines[:-1])], dtype=np.int64)
        rows = {**rows, "doc_offset": offsets}
        for name, spec in self.specs.items():
            data = np.ascontiguousarray(rows[name], dtype=np.dtype(spec.dtype))
            if data.shape[1:] != spec.tail:
                raise AttnscopeError(f"internal: {name} rows have shape {data.shape[1:]}, the index {spec.tail}")
            with (self.root / spec.file).open("ab") as handle:
                handle.write(data.tobytes())
        with doc_path.open("ab") as handle:
            handle.write(b"".join(lines))

    def sizes(self) -> dict[str, int]:
        """Each file's length in bytes, after syncing it to disk (what a checkpoint records)."""
        out = {}
        for name in self.files:
            path = self.root / name
            if path.exists():
                with path.open("rb+") as handle:
                    os.fsync(handle.fileno())
            out[name] = path.stat().st_size if path.exists() else 0
        return out

    def truncate(self, sizes: dict[str, int]) -> None:
        """Cut every file back to a checkpoint's lengths (a killed build may have appended more)."""
        for name in self.files:
            path = self.root / name
            size = sizes.get(name, 0)
            if not path.exists() and size == 0:
                continue
            if not path.exists() or path.stat().st_size < size:
                raise AttnscopeError(f"{path} is shorter than its checkpoint says: the index is damaged; "
                                     "build it again into a new directory")
            os.truncate(path, size)


def write_manifest(root: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Fill in every file's sha256 and the manifest's checksum, then write it atomically."""
    ann_files = manifest.get("ann", {}).get("files", {})
    for entry in [manifest["documents"], *manifest["arrays"].values(), *ann_files.values()]:
        entry["sha256"] = sha256_file(root / entry["file"])
    manifest["checksum"] = manifest_checksum(manifest)
    tmp = root / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, root / MANIFEST)
    return manifest


class CorpusIndex:
    """A built index, read through memory maps. verify=True checks each file's sha256 the first time it is read."""

    def __init__(self, path: str | os.PathLike[str], verify: bool = True):
        self.root = Path(path)
        self.verify = verify
        self.manifest = read_manifest(self.root)
        self._verified: set[str] = set()
        for entry in self.manifest["arrays"].values():
            self._check_size(entry)

    @property
    def model(self) -> str:
        return str(self.manifest["model"]["name"])

    @property
    def layers(self) -> list[int]:
        return [int(x) for x in self.manifest["layers"]]

    @property
    def heads(self) -> list[int]:
        return [int(x) for x in self.manifest["heads"]]

    @property
    def n_tokens(self) -> int:
        return int(self.manifest["corpus"]["tokens"])

    @property
    def n_documents(self) -> int:
        return int(self.manifest["corpus"]["documents"])

    @property
    def vocab(self) -> dict[str, list[str]]:
        return {k: list(v) for k, v in self.manifest["vocab"].items()}

    def array(self, name: str) -> np.ndarray:
        """The named array as a read-only memory map (e.g. "embedding.l3": [token, d_model])."""
        entry = self.manifest["arrays"].get(name)
        if entry is None:
            raise AttnscopeError(f"{self.root} has no array {name!r}")
        path = self.file(entry)
        shape = tuple(entry["shape"])
        if 0 in shape:
            return np.zeros(shape, dtype=np.dtype(entry["dtype"]))
        return np.memmap(path, dtype=np.dtype(entry["dtype"]), mode="r", shape=shape)

    def file(self, entry: dict[str, Any]) -> Path:
        """The path of a manifest entry's file, its sha256 checked on first use when verifying."""
        path: Path = self.root / str(entry["file"])
        if self.verify and entry["file"] not in self._verified:
            if sha256_file(path) != entry["sha256"]:
                raise AttnscopeError(f"{path} does not match the sha256 in {self.root / MANIFEST}: the index is "
                                     "corrupt; build it again (attnscope index)")
            self._verified.add(entry["file"])
        return path

    @cached_property
    def columns(self) -> dict[str, np.ndarray]:
        """The per-token columns (doc, position, token_id, start, end, special, word, upos, deprel)."""
        return {name: self.array(name) for name in TOKEN_COLUMNS}

    def document(self, row: int) -> dict[str, Any]:
        """Document `row` of documents.jsonl: text, where, number (its place in the corpus), words, ..."""
        offset = int(self.array("doc_offset")[row])
        with self.file({"file": DOCUMENTS, **self.manifest["documents"]}).open("rb") as handle:
            handle.seek(offset)
            line = handle.readline()
        try:
            out: dict[str, Any] = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise AttnscopeError(f"{self.root / DOCUMENTS}: document {row} cannot be read: the index is corrupt; "
                                 "build it again") from exc
        return out

    def _check_size(self, entry: dict[str, Any]) -> None:
        path = self.root / entry["file"]
        want = int(np.dtype(entry["dtype"]).itemsize * int(np.prod(entry["shape"], dtype=np.int64)))
        have = path.stat().st_size if path.is_file() else -1
        if have != want:
            what = "is missing" if have < 0 else f"has {have:,} bytes where the manifest says {want:,}"
            raise AttnscopeError(f"{path} {what}: the index is truncated or damaged; build it again "
                                 "(attnscope index)")


def read_manifest(root: Path) -> dict[str, Any]:
    """The manifest of an index directory, or one line saying why it is not a usable index."""
    path = root / MANIFEST
    if not path.is_file():
        hint = " (its build did not finish: run attnscope index again with --resume)" if (
            root / "build.json").is_file() else ""
        raise AttnscopeError(f"{root} is not a corpus index: it has no {MANIFEST}{hint}")
    try:
        manifest: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AttnscopeError(f"{path} cannot be read ({exc}): the index is corrupt; build it again") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise AttnscopeError(f"{path} is not an attnscope corpus index manifest")
    if manifest.get("version") != VERSION:
        raise AttnscopeError(f"{path} is version {manifest.get('version')} of the index format; this attnscope "
                             f"reads version {VERSION}: build the index again")
    if manifest.get("checksum") != manifest_checksum(manifest):
        raise AttnscopeError(f"{path} does not match its own checksum: the index is corrupt; build it again")
    return manifest


__all__ = ["BY", "FORMAT", "MANIFEST", "VERSION", "Appender", "ArraySpec", "CorpusIndex", "array_specs",
           "read_manifest", "write_manifest"]
