"""The Ray run: the driver cuts the local engine's batches, workers compute them, the driver merges.

Batches come from the local engine's one path (attnscope.stats.batching.numbered_batches),
numbered (chunk, batch) in its order, so every document is padded and bucketed with the same
neighbours and every per-document number is bit-for-bit the local one. States are exact integer
sums, so the merge does not depend on which worker finishes first. The checkpoint is the local
engine's (attnscope.stats.checkpoint): the merged state of the longest done prefix of batches and
the position after it, so a run started on one engine resumes on the other.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ray

from attnscope.errors import AttnscopeError
from attnscope.models import Model
from attnscope.stats import checkpoint
from attnscope.stats.batching import Batch, Key, numbered_batches
from attnscope.stats.distributed import reading
from attnscope.stats.distributed.workers import Pool, Work, shape
from attnscope.stats.engine import Progress, RunResult, Settings, finish, start
from attnscope.stats.sources import Source
from attnscope.stats.state import StatsState
from attnscope.stats.syntax import SyntaxCounts

log = logging.getLogger(__name__)


class Prefix:
    """The merged state of the batches done so far in the local order, and those done out of order."""

    def __init__(self, state: StatsState, position: Key):
        self.state, self.position = state, position
        self.order: deque[Key] = deque()  # keys sent and not yet merged, in the local order
        self.early: dict[Key, StatsState] = {}  # done, waiting for an earlier batch

    def expect(self, key: Key) -> None:
        self.order.append(key)

    def done(self, key: Key, part: StatsState) -> int:
        """Record a finished batch; returns how many batches joined the merged prefix."""
        self.early[key] = part
        merged = 0
        while self.order and self.order[0] in self.early:
            first = self.order.popleft()
            self.state = self.state.merge(self.early.pop(first))
            self.position = (first[0], first[1] + 1)
            merged += 1
        return merged

    @property
    def documents(self) -> int:
        return self.state.documents + sum(s.documents for s in self.early.values())

    @property
    def tokens(self) -> int:
        return self.state.tokens + sum(s.tokens for s in self.early.values())


def run(source: Source, model: Model, settings: Settings, outdir: str | Path, resume: bool = False,
        progress: Callable[[Progress], None] | None = None, total: int | None = None, *,
        workers: int | None = None, threads: int | None = None,
        worker_model: str | Model | None = None) -> RunResult:
    """`attnscope.stats.run` on the Ray runtime this process is connected to (see `connect`).

    Workers load `worker_model` (a name or path each node can load; default: `model` itself,
    shipped through Ray's object store). Results equal the local engine's exactly.
    """
    begun = start(source, model, settings, outdir, resume)
    identity, before, tokens_before = begun.identity, begun.state.documents, begun.state.tokens
    prefix = Prefix(begun.state, begun.position)
    pool = Pool(model if worker_model is None else worker_model, model, shape(workers, threads),
                f"attnscope-stats-{uuid.uuid4().hex[:8]}")
    for i, info in enumerate(pool.infos):
        log.info("Ray worker %d: pid %d on %s, %d threads", i, info["pid"], info["host"], info["threads"])
    started = time.perf_counter()
    checkpoints = Checkpoints(outdir, identity, settings.checkpoint_every)

    def report() -> None:
        if progress is not None:
            progress(Progress(prefix.documents, prefix.tokens, time.perf_counter() - started, total))

    try:
        batches = numbered_batches(model, reading.documents(source), settings, begun.position)
        _drive(pool, prefix, batches, ray.put(Work(_empty(begun.state), settings)), checkpoints, report)
    except KeyboardInterrupt:
        checkpoint.save(outdir, identity, prefix.state, prefix.position, complete=False)
        raise
    except AttnscopeError as exc:
        raise checkpoint.kept(exc, outdir, identity, prefix.state, prefix.position, before) from exc
    finally:
        pool.close()
    finish(source, outdir, identity, prefix.state, prefix.position)  # as in the local engine
    return RunResult(prefix.state, time.perf_counter() - started, before, tokens_before, source.malformed)


def _drive(pool: Pool, prefix: Prefix, batches: Iterator[tuple[Key, Batch]], work: Any,
           checkpoints: Checkpoints, report: Callable[[], None]) -> None:
    """Keep every worker busy until the batches run out, folding results in as they come."""
    pending = True
    while pending or pool.jobs:
        while pending and pool.room:
            nxt = next(batches, None)
            if nxt is None:
                pending = False
                break
            prefix.expect(nxt[0])
            pool.submit(nxt[0], nxt[1], work)
        if not pool.jobs:
            break
        for key, part in pool.next_done(work):
            checkpoints.after(prefix, prefix.done(key, part))
            report()


class Checkpoints:
    """Save the merged prefix every `every` batches merged in this process, as the local engine does."""

    def __init__(self, out: str | Path, identity: dict[str, Any], every: int):
        self.out, self.identity, self.every, self.merged = out, identity, every, 0

    def after(self, prefix: Prefix, merged: int) -> None:
        before, self.merged = self.merged, self.merged + merged
        if self.merged // self.every > before // self.every:
            checkpoint.save(self.out, self.identity, prefix.state, prefix.position, complete=False)


def _empty(state: StatsState) -> StatsState:
    """A state with nothing in it, of the same model, metrics and settings (what a worker folds a batch into)."""
    empty = StatsState(state.layers, state.heads, state.metrics, dict(state.settings))
    if state.syntax is not None:
        empty.syntax = SyntaxCounts(state.layers, state.heads)
    return empty
