"""Corpus passes on a Ray cluster: `attnscope stats|faithfulness|index SOURCE --engine ray`.

Ray is optional (`pip install 'attnscope[ray]'`) and imported only when a Ray run starts.
`run` connects to a cluster (or starts a local one), runs the local engine's batches on
worker actors and returns the same `RunResult`, with the same numbers, as `attnscope.stats.run`.
`ordered` runs any per-item task (a faithfulness run's documents, an index build's batches) on
the same workers and hands the results back in the items' order, for the caller's own loop;
`Engine` is a library call's choice of local or Ray (checked once), running such a task either way.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Generator, Hashable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from attnscope.errors import AttnscopeError
from attnscope.models import DEFAULT_MODEL, Model, ModelLike
from attnscope.stats.engine import Progress, RunResult, Settings
from attnscope.stats.sources import Source

if TYPE_CHECKING:
    from attnscope.stats.distributed.workers import Task  # (model, item, work) -> result, a module-level function

INSTALL = "pip install 'attnscope[ray]'"
K = TypeVar("K", bound=Hashable)


def require_ray(what: str = "attnscope.stats.distributed") -> ModuleType:
    """The ray module, or a one-line error saying that `what` needs it and how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise AttnscopeError(f"{what} needs Ray, which is not installed: {INSTALL}") from exc
    return ray


@contextmanager
def connect(address: str | None = None) -> Iterator[None]:
    """Use the Ray runtime this process already has, else join `address` (auto, ray://host:10001) or
    $RAY_ADDRESS, else start a local one; the connection made here is shut down on exit."""
    ray = require_ray()
    if ray.is_initialized():
        yield
        return
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    kwargs: dict[str, object] = {"log_to_driver": False, "logging_level": logging.WARNING}
    # no address: RAY_ADDRESS if set, else a new local runtime (not whatever `ray start` left on this machine)
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    if address == "local":
        kwargs["include_dashboard"] = False  # a local runtime: nothing to browse, nothing to serve
    try:
        ray.init(address=address, **kwargs)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        where = "a local runtime" if address == "local" else address
        raise AttnscopeError(f"could not start or join Ray at {where}: {str(exc).splitlines()[0]}") from exc
    try:
        yield
    finally:
        ray.shutdown()


def run(source: Source, model: Model, settings: Settings, outdir: str | os.PathLike[str], resume: bool = False,
        progress: Callable[[Progress], None] | None = None, total: int | None = None, *,
        address: str | None = None, workers: int | None = None, threads: int | None = None,
        worker_model: str | Model | None = None) -> RunResult:
    """The corpus statistics on Ray: the arguments and result of `attnscope.stats.run`, plus where to run.

    address: a Ray cluster ("auto", "ray://host:10001"); None starts a local runtime (or uses
    the one this process has). workers: how many actors (default: one per node); threads: torch
    threads per worker (default: the CPUs Ray gives it).
    worker_model: what each worker loads, a name or path every node has (default: `model`,
    shipped from this process).
    """
    require_ray()
    with connect(address):
        from attnscope.stats.distributed import engine

        return engine.run(source, model, settings, Path(outdir), resume, progress, total,
                          workers=workers, threads=threads, worker_model=worker_model)


ENGINES = ("local", "ray")


@dataclass(frozen=True, kw_only=True)
class Engine:
    """Where a corpus pass runs its items: here (local), or on Ray workers (`ordered`), with the same results."""

    name: str = "local"
    workers: int | None = None  # Ray actors (default: one per node)
    address: str | None = None  # the cluster (default: a local runtime)
    threads: int | None = None  # torch threads per worker (default: the CPUs Ray gives it)
    worker_model: str | None = None  # what a worker loads by name (None: the driver's model is shipped)

    @classmethod
    def of(cls, engine: str = "local", workers: int | None = None, address: str | None = None,
           threads: int | None = None, model: ModelLike = None, placed: bool = False) -> Engine:
        """The engine a library call asks for, checked (one line naming the parameter); a missing Ray is reported
        here, before any model loads. model: what the call loads; placed: it gave device or dtype."""
        if engine not in ENGINES:
            raise AttnscopeError(f"engine={engine!r} is not an engine: choose local or ray", parameter="engine")
        if engine == "local" and (workers is not None or address is not None or threads is not None):
            raise AttnscopeError("workers, address and threads choose where a Ray run goes: add engine='ray'",
                                 parameter="engine")
        for name, value in (("workers", workers), ("threads", threads)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise AttnscopeError(f"{name}={value!r} must be a positive integer", parameter=name)
        if engine == "local":
            return cls()
        if placed:
            raise AttnscopeError("device and dtype place the model of a local run: drop them with engine='ray'",
                                 parameter="engine")
        require_ray("engine='ray'")
        return cls(name="ray", workers=workers, address=address, threads=threads, worker_model=by_name(model))

    def run(self, task: Task, items: Iterable[tuple[K, Any]], model: Model, work: Any,
            name: str = "attnscope") -> Generator[tuple[K, Any], None, None]:
        """(key, task(model, item, work)) for each (key, item), in order: here, or on Ray (`ordered`)."""
        if self.name == "local":
            return ((key, task(model, item, work)) for key, item in items)
        return ordered(task, items, model, work, address=self.address, workers=self.workers,
                       threads=self.threads, worker_model=self.worker_model, name=name)


def by_name(model: ModelLike) -> str | None:
    """What a Ray worker loads by name: a hub name or the bundled model's; None ships the driver's loaded model
    (a Model, or a local path the other nodes may not have)."""
    if isinstance(model, Model):
        return None
    if model is None:
        return DEFAULT_MODEL
    return None if Path(str(model)).expanduser().exists() else str(model)


def ordered(task: Task, items: Iterable[tuple[K, Any]], model: Model,
            work: Any, *, what: str = "engine='ray'", address: str | None = None, workers: int | None = None,
            threads: int | None = None, worker_model: str | Model | None = None,
            name: str = "attnscope") -> Generator[tuple[K, Any], None, None]:
    """(key, task(model, item, work)) for each (key, item), in order, on Ray workers (see passes.ordered).

    A missing Ray is reported here, naming `what`, before anything runs. `task` must be a module-level
    function (the workers import it by name). Close the generator to stop the workers early."""
    require_ray(what)
    return _connected(address, task, items, model, work, workers=workers, threads=threads,
                      worker_model=worker_model, name=name)


def _connected(address: str | None, *args: Any, **kwargs: Any) -> Generator[tuple[Any, Any], None, None]:
    """passes.ordered(*args, **kwargs) inside connect(address): the runtime started here ends with the pass."""
    from attnscope.stats.distributed import passes

    with connect(address):
        yield from passes.ordered(*args, **kwargs)


__all__ = ["ENGINES", "INSTALL", "Engine", "by_name", "connect", "ordered", "require_ray", "run"]
