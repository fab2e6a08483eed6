"""Ray actors that load the model once and run one task per item, and the pool that feeds them.

A task is a module-level function `task(model, item, work) -> result` (Ray pickles it by
reference): the corpus statistics' `stats_batch` (a batch -> its exact mergeable state), a
faithfulness run's one document -> its rows, an index build's one batch -> its token rows.
Ray restarts a dead worker (reloading the model) and retries its items; a worker that is gone
for good has its items sent to the others.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import ray
import torch
from ray.exceptions import RayActorError, RayTaskError

from attnscope.errors import AttnscopeError
from attnscope.models import Model, load_model
from attnscope.stats.batching import Batch
from attnscope.stats.engine import Settings, run_batch
from attnscope.stats.state import StatsState

RESTARTS = 3  # times Ray restarts a dead worker
TASK_RETRIES = 3  # times Ray resends an item whose worker died
RESUBMITS = 3  # times the pool sends an item to another worker once its own is gone for good
IN_FLIGHT = 2  # items queued per worker: one running, one waiting, so a worker never idles


Task = Callable[[Model, Any, Any], Any]  # (model, item, work) -> result; module-level, so Ray pickles it by name


class Worker:
    """One model per process; each call runs the pool's task on one item and returns its result alone."""

    def __init__(self, model: str | list[Any] | None, threads: int, task: Task):
        torch.set_num_threads(threads)
        # a shipped Model comes as [ObjectRef]: fetched here, so a restarted worker fetches it again
        self.model = load_model(ray.get(model[0]) if isinstance(model, list) else model)
        self.task = task

    def describe(self) -> dict[str, Any]:
        m = self.model
        return {"name": m.name, "layers": m.n_layers, "heads": m.n_heads, "pid": os.getpid(),
                "host": socket.gethostname(), "threads": torch.get_num_threads()}

    def run(self, item: Any, work: Any) -> Any:
        return self.task(self.model, item, work)


@dataclass(frozen=True)
class Work:
    """What every batch of a run needs besides itself (put in the object store once): the empty state a
    batch is folded into, and the run's settings, which say what the worker computes."""

    empty: StatsState
    settings: Settings


def stats_batch(model: Model, batch: Batch, work: Work) -> StatsState:
    """The corpus statistics' task: one batch's statistics alone."""
    return run_batch(model, batch, work.empty, work.settings)


RemoteWorker = ray.remote(max_restarts=RESTARTS, max_task_retries=TASK_RETRIES)(Worker)


@dataclass
class Job:
    key: Hashable  # the item's place in the run's order (stats: (chunk, batch))
    item: Any  # ObjectRef of the item, kept for resubmission
    worker: int
    tries: int = 1


@dataclass(frozen=True)
class Shape:
    """How many workers, and the CPUs each asks Ray for and uses."""

    workers: int
    cpus: float  # logical CPUs reserved per worker (placement)
    threads: int  # torch threads per worker


def shape(workers: int | None, threads: int | None = None) -> Shape:
    """Split the cluster's CPUs over the workers (default: one per node, each with its node's CPUs)."""
    total = float(ray.cluster_resources().get("CPU", 1.0))  # type: ignore[no-untyped-call]
    nodes = [float(n["Resources"].get("CPU", 0.0)) for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
    largest = max(nodes, default=total)
    n = workers if workers is not None else max(1, len(nodes))
    if n < 1:
        raise AttnscopeError(f"workers={n} must be at least 1", parameter="workers")
    if threads is not None and threads < 1:
        raise AttnscopeError(f"threads={threads} must be at least 1", parameter="threads")
    each = threads or max(1, int(min(largest, total // n)))
    return Shape(n, min(float(each), largest, total / n), each)


class Pool:
    """Workers plus the items in flight on them; results come back as (key, result) in completion order."""

    def __init__(self, model: str | Model | None, expected: Model, plan: Shape, name: str,
                 task: Task = stats_batch):
        # the driver holds the shipped model for the pool's life: a restarted worker needs it again
        self.shipped = [ray.put(model)] if isinstance(model, Model) else None
        spec = self.shipped if self.shipped is not None else model
        self.plan = plan
        self.workers: list[Any] = [
            RemoteWorker.options(num_cpus=plan.cpus, name=f"{name}-{i}").remote(spec, plan.threads, task)
            for i in range(plan.workers)
        ]
        self.alive = set(range(plan.workers))
        self.jobs: dict[Any, Job] = {}
        self.infos = self._check(expected)

    def _check(self, expected: Model) -> list[dict[str, Any]]:
        """Wait for every worker's model and make sure it is the driver's."""
        try:
            infos: list[dict[str, Any]] = ray.get([w.describe.remote() for w in self.workers])
        except RayTaskError as exc:
            raise worker_error(exc) from exc
        want = (expected.name, expected.n_layers, expected.n_heads)
        for info in infos:
            if (info["name"], info["layers"], info["heads"]) != want:
                raise AttnscopeError(f"a Ray worker on {info['host']} loaded {info['name']} "
                                     f"({info['layers']}x{info['heads']}), not {want[0]}: "
                                     "install the same model on every node, or pass a loaded Model")
        return infos

    @property
    def room(self) -> bool:
        return len(self.jobs) < IN_FLIGHT * len(self.alive)

    def submit(self, key: Hashable, item: Any, work: Any) -> None:
        self._send(Job(key, ray.put(item), -1, 0), work)

    def _send(self, job: Job, work: Any) -> None:
        if not self.alive:
            raise AttnscopeError("every Ray worker has died: see the Ray logs (e.g. out of memory), "
                                 "then run again with resume=True")
        load = {i: 0 for i in self.alive}
        for j in self.jobs.values():
            if j.worker in load:
                load[j.worker] += 1
        job.worker = min(load, key=lambda i: (load[i], i))
        job.tries += 1
        self.jobs[self.workers[job.worker].run.remote(job.item, work)] = job

    def next_done(self, work: Any) -> list[tuple[Any, Any]]:
        """Block until at least one item is done; resend the items of workers that are gone."""
        ready, _ = ray.wait(list(self.jobs), num_returns=1)
        done = []
        for ref in ready:
            job = self.jobs.pop(ref)
            try:
                done.append((job.key, ray.get(ref)))
            except RayActorError as exc:
                self.alive.discard(job.worker)  # Ray's restarts are used up: this worker is gone
                if job.tries > RESUBMITS:
                    raise AttnscopeError(f"item {job.key} was lost with {job.tries} workers "
                                         f"({type(exc).__name__}): see the Ray logs, then run again with resume=True"
                                         ) from exc
                self._send(job, work)
            except RayTaskError as exc:
                raise worker_error(exc) from exc
        return done

    def close(self) -> None:
        for w in self.workers:
            ray.kill(w, no_restart=True)


def worker_error(exc: RayTaskError, where: str = "", advice: str = "") -> AttnscopeError:
    """The worker's own AttnscopeError, or one line: "a Ray worker failed{where}: Type: first line; advice"."""
    cause = exc.cause
    if isinstance(cause, AttnscopeError):
        return cause
    first = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    tail = f"; {advice}" if advice else ""
    return AttnscopeError(f"a Ray worker failed{where}: {type(cause).__name__}: {first}{tail}")
