"""Corpus passes on a Ray cluster: `attnscope stats|faithfulness|index SOURCE --engine ray`.

Ray is optional (`pip install 'attnscope[ray]'`) and imported only when a Ray run starts.
`run` connects to a cluster (or starts a local one), runs the local engine's batches on
worker actors and returns the same `RunResult`, with the same numbers, as `attnscope.stats.run`.
`ordered` runs any per-item task (a faithfulness run's documents, an index build's batches) on
the same workers and hands the results back in the items' order, for the caller's own loop.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Generator, Hashable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from attnscope.errors import AttnscopeError
from attnscope.models import Model
from attnscope.stats.engine import Progress, RunResult, Settings
from attnscope.stats.sources import Source

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


def ordered(task: Callable[[Model, Any, Any], Any], items: Iterable[tuple[K, Any]], model: Model,
            work: Any, *, what: str = "engine='ray'", address: str | None = None, workers: int | None = None,
            threads: int | None = None, worker_model: str | Model | None = None,
            name: str = "attnscope") -> Generator[tuple[K, Any], None, None]:
    """(key, task(model, item, work)) for each (key, item), in order, on Ray workers (see passes.ordered).

    A missing Ray is reported here, naming `what`, before anything runs. `task` must be a module-level
    function (the workers import it by name). Close the generator to stop the workers early."""
    require_ray(what)
    from attnscope.stats.distributed import passes

    return passes.ordered(task, items, model, work, address=address, workers=workers, threads=threads,
                          worker_model=worker_model, name=name)


__all__ = ["INSTALL", "connect", "ordered", "require_ray", "run"]
