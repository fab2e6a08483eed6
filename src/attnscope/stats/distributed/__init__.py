"""Corpus statistics on a Ray cluster: `attnscope stats SOURCE --engine ray`.

Ray is optional (`pip install 'attnscope[ray]'`) and imported only when a Ray run starts.
`run` connects to a cluster (or starts a local one), runs the local engine's batches on
worker actors and returns the same `RunResult`, with the same numbers, as `attnscope.stats.run`.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from attnscope.errors import AttnscopeError
from attnscope.models import DEFAULT_MODEL, Model
from attnscope.stats.engine import Progress, RunResult, Settings
from attnscope.stats.sources import Source

INSTALL = "pip install 'attnscope[ray]'"


def require_ray() -> ModuleType:
    """The ray module, or a one-line error saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise AttnscopeError(f"--engine ray needs Ray, which is not installed: {INSTALL}") from exc
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


def cli_runner(engine: str, address: str | None, workers: int | None,
               model: str | None) -> Callable[..., RunResult]:
    """What `attnscope stats --engine` runs: `attnscope.stats.run`, or this module's `run` bound to the
    cluster options (a missing Ray is reported here, before any model loads). Workers load a hub name
    or the bundled model themselves; a local checkpoint directory is shipped from this process."""
    if engine != "ray":
        if address is not None or workers is not None:
            raise AttnscopeError("--address and --workers choose where a Ray run goes: add --engine ray")
        from attnscope.stats.engine import run as run_local

        return run_local
    require_ray()
    shipped = model is not None and Path(model).expanduser().exists()
    return functools.partial(run, address=address, workers=workers,
                             worker_model=None if shipped else (model or DEFAULT_MODEL))


__all__ = ["INSTALL", "cli_runner", "connect", "require_ray", "run"]
