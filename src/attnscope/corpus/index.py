"""Build a corpus index: one streaming pass over a corpus through the real model, checkpointed and resumable.

The documents and batches are the corpus statistics' (attnscope.stats.batching: chunks of documents, each cut into
length buckets, each batch numbered (chunk, batch)). Each batch's rows are appended to the index's files; every
`checkpoint_every` batches the files are synced and build.json records their lengths, the position after the
batch and the label vocabularies. A build killed at any moment (even SIGKILL) resumes from the last checkpoint:
the files are cut back to its lengths and the remaining batches are the same, so the index is byte for byte the
one an uninterrupted build writes. The manifest (with every file's sha256) is written last.

engine="ray" runs the batches on Ray workers (attnscope.stats.distributed.Engine): each batch is the same task as
here (`batch_part`: its rows with labels coded batch by batch), and the driver takes the parts back in the
batches' order, codes the labels in the index's vocabularies and appends them as a local build does, so the files
and the manifest's checksums are byte for byte a local build's.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnscope import families
from attnscope.corpus import ann as ann_lib
from attnscope.corpus.store import (
    DOCUMENTS,
    FORMAT,
    MANIFEST,
    VERSION,
    Appender,
    ArraySpec,
    array_specs,
    read_manifest,
    write_manifest,
)
from attnscope.corpus.tags import UPOS, Vocab
from attnscope.corpus.vectors import Choice, batch_rows, token_offsets
from attnscope.errors import AttnscopeError, validate_index
from attnscope.models import Model, ModelLike, describe, load_model
from attnscope.stats.batching import Batch, Key, batches, chunks
from attnscope.stats.checkpoint import differences
from attnscope.stats.distributed import Engine
from attnscope.stats.engine import Progress
from attnscope.stats.settings import Settings, guarded, validate_settings
from attnscope.stats.sources import Source

log = logging.getLogger(__name__)

CHECKPOINT = "build.json"


@dataclass(frozen=True, kw_only=True)
class BuildResult:
    """What a build did: where the index is, what it holds, how long this process took."""

    path: Path
    documents: int
    tokens: int
    truncated: int
    malformed: int
    seconds: float
    resumed_from: int  # documents an earlier, interrupted build had done
    ann: str | None  # the approximate index's library, None without one


@dataclass(kw_only=True)
class _Run:
    """A build's progress: the position after the last batch, the counts and the label vocabularies."""

    identity: dict[str, Any]
    position: tuple[int, int] = (0, 0)  # (chunk, batch) of the next batch
    documents: int = 0
    tokens: int = 0
    truncated: int = 0
    complete: bool = False  # a resumed build that had finished
    upos: Vocab = field(default_factory=lambda: Vocab(UPOS))
    deprel: Vocab = field(default_factory=Vocab)

    def to_json(self, sizes: dict[str, int], complete: bool) -> dict[str, Any]:
        return {"identity": self.identity, "chunk": self.position[0], "batch": self.position[1],
                "complete": complete, "sizes": sizes, "documents": self.documents, "tokens": self.tokens,
                "truncated": self.truncated, "vocab": {"upos": self.upos.labels, "deprel": self.deprel.labels}}


def choose(model: Model, layers: Sequence[int] | None, heads: Sequence[int] | None) -> Choice:
    """The layers and heads an index keeps (default: all), each validated against the model (0-indexed)."""
    chosen_layers = tuple(sorted(set(range(model.n_layers) if layers is None else layers)))
    chosen_heads = tuple(sorted(set(range(model.n_heads) if heads is None else heads)))
    if not chosen_layers or not chosen_heads:
        raise AttnscopeError("an index needs at least one layer and one head", parameter="layers")
    for layer in chosen_layers:
        validate_index("layer", layer, model.n_layers, model.name)
    for head in chosen_heads:
        validate_index("head", head, model.n_heads, model.name)
    return Choice(layers=chosen_layers, heads=chosen_heads)


def identity(model: Model, source: Source, settings: Settings, choice: Choice) -> dict[str, Any]:
    """What a resume must match: the format, the model (and its dtype), the source, the settings that decide
    which batch comes where, the layers and the heads. JSON-able."""
    values = settings.to_json()
    return {"format": FORMAT, "version": VERSION, "model": model.name, "dtype": str(model.dtype).removeprefix("torch."),
            "source": source.describe(), "settings": {k: values[k] for k in guarded() if k != "metric_sets"},
            "layers": list(choice.layers), "heads": list(choice.heads)}


def sizes_of(model: Model) -> tuple[int, int, int]:
    """(d_model, d_head, heads * d_head) from the model's configuration."""
    config = families.text_config(model.model.config)
    d_model = int(config.hidden_size)
    d_head = int(getattr(config, "head_dim", None) or d_model // model.n_heads)
    return d_model, d_head, model.n_heads * d_head


def build_index(source: Source, out: str | os.PathLike[str], model: ModelLike = None, *,
                layers: Sequence[int] | None = None, heads: Sequence[int] | None = None,
                settings: Settings | None = None, resume: bool = False, ann: Sequence[str] = ann_lib.KINDS,
                progress: Callable[[Progress], None] | None = None, engine: str | Engine = "local",
                workers: int | None = None, address: str | None = None, threads: int | None = None) -> BuildResult:
    """Index a corpus into the directory `out` (see attnscope.corpus.store for the format).

    layers, heads: what to keep (0-indexed; default all). settings: the corpus statistics' reading and batching
    (max_length, batch_size, limit, checkpoint_every, ...). resume=True continues an interrupted build in `out`.
    ann: the vectors that get an approximate index (embedding, context; () for none: exact search needs none).
    engine="ray": the batches on Ray workers (pip install 'attnscope[ray]'), `workers` of them (default one per
    node) with `threads` torch threads each, on the cluster at `address` (default a local runtime); the files are
    a local build's byte for byte when each process runs as many torch threads as this one. An Engine
    (attnscope.stats.distributed.Engine) says all of that, and what the workers load, at once."""
    where = engine if isinstance(engine, Engine) else Engine.of(engine, workers, address, threads, model)
    m = model if isinstance(model, Model) else load_model(model)
    settings = settings or Settings(max_length=min(256, m.max_positions))
    validate_settings(m, settings)
    choice = choose(m, layers, heads)
    d_model, d_head, d_context = sizes_of(m)
    specs = array_specs(choice.layers, len(choice.heads), d_model, d_context, d_head)
    root = Path(out)
    state, done = _start(root, identity(m, source, settings, choice), resume)
    if state.complete:  # nothing left to do: the index is there as it was
        done_manifest = read_manifest(root)
        return BuildResult(path=root, documents=state.documents, tokens=state.tokens, truncated=state.truncated,
                           malformed=int(done_manifest["corpus"]["malformed"]), seconds=0.0,
                           resumed_from=state.documents, ann=done_manifest.get("ann", {}).get("library"))
    appender = Appender(root, specs)
    if resume:
        appender.truncate(done)
    before, started = state.documents, time.perf_counter()
    try:
        _batches(m, source, settings, choice, state, appender, root, progress, where)
    except KeyboardInterrupt:
        _save(root, state, appender.sizes(), complete=False)
        raise
    except AttnscopeError as exc:
        if state.documents == before:
            raise
        _save(root, state, appender.sizes(), complete=False)
        raise AttnscopeError(f"{exc} ({state.documents} documents before it are kept in {root}: fix the cause and "
                             "build again with resume=True to continue)") from exc
    if state.documents == 0:
        raise AttnscopeError(f"{source.spec} has no documents to read")
    sizes = appender.sizes()
    _save(root, state, sizes, complete=False)
    manifest = _manifest(m, source, settings, choice, state, specs, d_head)
    manifest["ann"] = ann_lib.build_all(root, manifest, tuple(ann))
    write_manifest(root, manifest)
    _save(root, state, sizes, complete=True)
    return BuildResult(path=root, documents=state.documents, tokens=state.tokens, truncated=state.truncated,
                       malformed=source.malformed, seconds=time.perf_counter() - started, resumed_from=before,
                       ann=manifest["ann"].get("library"))


def _batches(m: Model, source: Source, settings: Settings, choice: Choice, state: _Run, appender: Appender,
             root: Path, progress: Callable[[Progress], None] | None, engine: Engine) -> None:
    """Run the batches from the state's position on (here or on Ray), appending their rows in order and
    checkpointing."""
    started, n_batches = time.perf_counter(), 0
    parts = engine.run(batch_part, numbered(m, source, settings, state.position), m, (choice, settings.max_length),
                       name="attnscope-index")
    try:
        for key, part in parts:
            appender.append(*recoded(part, state))
            state.position = (key[0], key[1] + 1)
            state.documents += part.documents
            state.tokens += part.tokens
            state.truncated += part.truncated
            n_batches += 1
            if n_batches % settings.checkpoint_every == 0:
                _save(root, state, appender.sizes(), complete=False)
            if progress is not None:
                progress(Progress(state.documents, state.tokens, time.perf_counter() - started, None))
    finally:
        parts.close()  # a Ray build stops its workers (and the runtime it started) here


def numbered(m: Model, source: Source, settings: Settings,
             start: Key) -> Iterator[tuple[Key, tuple[Batch, list[int]]]]:
    """The build's batches from `start` on, each keyed (chunk, batch), with its documents' places in the corpus."""
    for c, chunk in enumerate(chunks(source, settings.limit, settings.chunk_documents)):
        if c < start[0]:
            continue
        skip = start[1] if c == start[0] else 0
        number = {id(d): c * settings.chunk_documents + i for i, d in enumerate(chunk)}
        for j, batch in enumerate(batches(m, chunk, settings, skip=skip)):
            yield (c, skip + j), (batch, [number[id(d.doc)] for d in batch.docs])


@dataclass(frozen=True, kw_only=True)
class Part:
    """One batch's rows as a worker computes them: documents numbered from 0, labels coded in the batch's own
    vocabularies (`upos`, `deprel`: the labels of codes 0, 1, ...)."""

    rows: dict[str, np.ndarray]
    lines: list[dict[str, Any]]
    upos: list[str]
    deprel: list[str]
    documents: int
    tokens: int
    truncated: int


def batch_part(m: Model, item: tuple[Batch, list[int]], work: tuple[Choice, int]) -> Part:
    """The build's task, here or on a Ray worker: one batch (and its documents' numbers) -> its Part."""
    batch, numbers = item
    choice, max_length = work
    offsets = token_offsets(m, batch.docs, max_length)
    upos, deprel = Vocab(UPOS), Vocab()
    rows, lines = batch_rows(m, batch, choice, offsets, upos, deprel, numbers, 0)
    return Part(rows=rows, lines=lines, upos=upos.labels, deprel=deprel.labels, documents=len(batch.docs),
                tokens=batch.tokens, truncated=sum(d.truncated for d in batch.docs))


def recoded(part: Part, state: _Run) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
    """A part's rows as the index stores them: documents numbered after those done, labels in the index's
    vocabularies (taken in the batch's order of first appearance, so new labels get the codes a one-vocabulary
    pass gives them)."""
    rows = dict(part.rows)
    rows["doc"] = part.rows["doc"] + state.documents
    for name, labels, vocab in (("upos", part.upos, state.upos), ("deprel", part.deprel, state.deprel)):
        codes = np.array([vocab.code(label) for label in labels] + [-1], dtype=np.int64)  # [-1]: no label
        rows[name] = codes[part.rows[name]]
    return rows, part.lines


def _start(root: Path, ident: dict[str, Any], resume: bool) -> tuple[_Run, dict[str, int]]:
    """A new build (root created, empty), or with resume the checkpointed one and its files' lengths."""
    path = root / CHECKPOINT
    if resume and path.is_file():
        data = _load(path)
        changed = differences(data["identity"], json.loads(json.dumps(ident)))
        if changed:
            raise AttnscopeError(f"{path} is from a build with other arguments ({changed}): resume with the same "
                                 "arguments, or build into another directory")
        run = _Run(identity=ident, position=(int(data["chunk"]), int(data["batch"])), documents=data["documents"],
                   tokens=data["tokens"], truncated=data["truncated"], upos=Vocab(data["vocab"]["upos"]),
                   deprel=Vocab(data["vocab"]["deprel"]))
        run.complete = bool(data["complete"]) and (root / MANIFEST).is_file()
        log.info("resuming %s at chunk %d, batch %d", root, *run.position)
        return run, {str(k): int(v) for k, v in data["sizes"].items()}
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        hint = "pass resume=True to continue that build, or" if path.is_file() else "it has no build to resume:"
        raise AttnscopeError(f"{root} already exists and is not empty: {hint} choose another output directory",
                             parameter="resume" if path.is_file() else None)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AttnscopeError(f"cannot create {root}: {exc.strerror or exc}: choose another directory") from exc
    return _Run(identity=ident), {}


def _load(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        missing = [k for k in ("identity", "chunk", "batch", "sizes", "documents", "tokens", "truncated", "vocab")
                   if k not in data]
        if missing:
            raise KeyError(", ".join(missing))
        return data
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise AttnscopeError(f"cannot read the build checkpoint {path} ({exc}): build into another directory") from exc


def _save(root: Path, state: _Run, sizes: dict[str, int], complete: bool) -> None:
    """Write build.json atomically, after the files it describes are on disk (Appender.sizes syncs them)."""
    tmp = root / (CHECKPOINT + ".tmp")
    tmp.write_text(json.dumps(state.to_json(sizes, complete)), encoding="utf-8")
    os.replace(tmp, root / CHECKPOINT)


def _manifest(m: Model, source: Source, settings: Settings, choice: Choice, state: _Run, specs: list[ArraySpec],
              d_head: int) -> dict[str, Any]:
    counts = {"token": state.tokens, "document": state.documents}
    d_model, _, d_context = sizes_of(m)
    return {
        "format": FORMAT, "version": VERSION,
        "model": {**describe(m), "d_model": d_model, "d_head": d_head, "d_context": d_context},
        "layers": list(choice.layers), "heads": list(choice.heads),
        "corpus": {**source.describe(), "documents": state.documents, "tokens": state.tokens,
                   "truncated": state.truncated, "malformed": source.malformed},
        "settings": {k: v for k, v in settings.to_json().items() if k not in ("metric_sets", "checkpoint_every")},
        "vocab": {"upos": state.upos.labels, "deprel": state.deprel.labels},
        "documents": {"file": DOCUMENTS},
        "arrays": {s.name: {"file": s.file, "dtype": s.dtype, "shape": [counts[s.rows], *s.tail]} for s in specs},
    }


__all__ = ["CHECKPOINT", "BuildResult", "Part", "batch_part", "build_index", "choose"]
