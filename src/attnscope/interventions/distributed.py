"""Head importance on Ray: `attnscope importance SOURCE -o OUTDIR --engine ray`.

The driver cuts the local engine's batches (importance.pending), worker actors each hold the model
(shipped once through the object store) and run the local engine's one batch path
(importance.batch_gradients); the driver folds the results in the local order, in float64, so the
sums equal the local engine's. The checkpoint is the local engine's (the sums of the longest done
prefix of batches), so a run started on one engine resumes on the other. Connecting to Ray and
sizing the workers reuse attnscope.stats.distributed (connect, shape). Ray is imported only here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from attnscope.errors import AttnscopeError
from attnscope.interventions.effects import kind_of
from attnscope.interventions.importance import (
    ImportanceSettings,
    Sums,
    batch_gradients,
    identity,
    pending,
    save,
    start,
)
from attnscope.models import Model, load_model
from attnscope.stats.distributed import connect, require_ray

IN_FLIGHT = 2  # batches queued per worker: one running, one waiting


class ImportanceWorker:
    """One model per process; each call returns one batch's (documents, tokens, sum |gradient| [layer, head])."""

    def __init__(self, threads: int):
        torch.set_num_threads(threads)
        self.model: Model | None = None

    def run(self, model: list[Any], chunk: list[str], settings: ImportanceSettings) -> tuple[int, int, torch.Tensor]:
        """model: [ObjectRef of the Model], fetched at the first call (again after Ray restarts this worker):
        no object-store argument in the constructor, whose loss would make a restart fail."""
        import ray

        if self.model is None:
            self.model = load_model(ray.get(model[0]))
        tokens, grad = batch_gradients(self.model, kind_of(self.model), chunk, settings)
        return len(chunk), tokens, grad


class Fold:
    """The sums of the batches done so far in the local order; later batches wait for earlier ones."""

    def __init__(self, sums: Sums, out: Path, ident: dict[str, Any], every: int):
        self.sums, self.out, self.ident, self.every = sums, out, ident, every
        self.total = torch.tensor(sums.total, dtype=torch.float64)  # [layer, head]
        self.next, self.merged = 0, 0
        self.early: dict[int, tuple[int, int, torch.Tensor]] = {}

    def done(self, n: int, part: tuple[int, int, torch.Tensor]) -> bool:
        """Record batch n; True when it let batches join the folded prefix."""
        self.early[n] = part
        before = self.next
        while self.next in self.early:
            documents, tokens, grad = self.early.pop(self.next)
            self.total += grad  # in order, as the local loop adds: the same float64 sums
            self.sums = Sums(self.sums.documents + documents, self.sums.tokens + tokens, self.total.tolist())
            self.next, self.merged = self.next + 1, self.merged + 1
            if self.merged % self.every == 0:
                save(self.out, self.ident, self.sums)
        return self.next > before


def accumulate(m: Model, texts: Iterable[str], outdir: str | os.PathLike[str], source: dict[str, Any],
               settings: ImportanceSettings, resume: bool = False,
               progress: Callable[[int, int], None] | None = None, *,
               address: str | None = None, workers: int | None = None, threads: int | None = None) -> Sums:
    """`importance.accumulate` on Ray, same arguments and the same sums, plus where to run.

    address: a Ray cluster ("auto", "ray://host:10001"); None starts a local runtime (or uses the
    one this process has). workers: how many actors (default: one per node); threads: torch
    threads per worker (default: the CPUs Ray gives it). Every worker receives `m` from this process.
    """
    require_ray("head importance on Ray")
    with connect(address):
        return _accumulate(m, texts, Path(outdir), source, settings, resume, progress, workers, threads)


def _accumulate(m: Model, texts: Iterable[str], out: Path, source: dict[str, Any], settings: ImportanceSettings,
                resume: bool, progress: Callable[[int, int], None] | None,
                workers: int | None, threads: int | None) -> Sums:
    import ray

    from attnscope.stats.distributed.workers import RESTARTS, TASK_RETRIES, shape

    ident = identity(m, source, settings)
    fold = Fold(start(out, ident, resume, m.n_layers, m.n_heads), out, ident, settings.checkpoint_every)
    plan = shape(workers, threads)
    remote = ray.remote(max_restarts=RESTARTS, max_task_retries=TASK_RETRIES)(ImportanceWorker)
    shipped = [ray.put(m)]  # in a list, so Ray passes the reference and the worker fetches it once
    actors: list[Any] = [remote.options(num_cpus=plan.cpus).remote(plan.threads) for _ in range(plan.workers)]
    try:
        _drive(actors, fold, pending(texts, fold.sums, settings), (shipped, ray.put(settings)), progress)
    except (KeyboardInterrupt, AttnscopeError):
        save(out, ident, fold.sums)  # the folded prefix: what a resume continues from
        raise
    finally:
        for a in actors:
            ray.kill(a, no_restart=True)
    if fold.sums.documents == 0:
        raise AttnscopeError("the source has no documents to read: give a file with at least one text")
    save(out, ident, fold.sums)
    return fold.sums


def _drive(actors: list[Any], fold: Fold, chunks: Iterable[list[str]], shared: tuple[list[Any], Any],
           progress: Callable[[int, int], None] | None) -> None:
    """Keep IN_FLIGHT batches on every worker (round robin) until the batches run out; fold results as they come."""
    jobs: dict[Any, int] = {}
    for n, chunk in enumerate(chunks):
        while len(jobs) >= IN_FLIGHT * len(actors):
            _collect(jobs, fold, progress)
        jobs[actors[n % len(actors)].run.remote(shared[0], chunk, shared[1])] = n  # shared: ([model ref], settings)
    while jobs:
        _collect(jobs, fold, progress)


def _collect(jobs: dict[Any, int], fold: Fold, progress: Callable[[int, int], None] | None) -> None:
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    from attnscope.stats.distributed.workers import worker_error

    (ref,), _ = ray.wait(list(jobs), num_returns=1)
    n = jobs.pop(ref)
    try:
        folded = fold.done(n, ray.get(ref))
    except RayTaskError as exc:  # the worker's own one-line error, or what failed there in one line
        raise worker_error(exc, f" on batch {n}", "run again with resume=True") from None
    except RayActorError as exc:  # Ray's restarts of that worker are used up
        raise AttnscopeError(f"the Ray worker of batch {n} died ({type(exc).__name__}): see the Ray logs "
                             "(e.g. out of memory), then run again with resume=True") from None
    if folded and progress is not None:  # progress counts what a resume keeps: the folded prefix
        progress(fold.sums.documents, fold.sums.tokens)
