"""Any corpus pass on Ray, its results handed back in the pass's own order.

The driver numbers the items (a faithfulness run's documents, an index build's batches), the
workers run one task per item (attnscope.stats.distributed.workers: a module-level function of
the model, the item and the run's shared `work`), and `in_order` yields each result once every
item before it has been yielded: the driver then writes, checkpoints and resumes exactly as the
local loop does, so the files are the local ones byte for byte. Results that arrive early wait
in a bounded window (a slow item holds back at most WINDOW items per worker).
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Generator, Hashable, Iterable, Iterator
from typing import Any, TypeVar

import ray

from attnscope.models import Model
from attnscope.stats.distributed.workers import IN_FLIGHT, Pool, Task, shape

log = logging.getLogger(__name__)

WINDOW = 4 * IN_FLIGHT  # items per worker sent or done but not yet yielded
K = TypeVar("K", bound=Hashable)


def ordered(task: Task, items: Iterable[tuple[K, Any]], model: Model, work: Any, *, workers: int | None = None,
            threads: int | None = None, worker_model: str | Model | None = None,
            name: str = "attnscope") -> Generator[tuple[K, Any], None, None]:
    """(key, task(model, item, work)) for each (key, item), in the items' order, computed on Ray workers of the
    runtime this process is connected to (attnscope.stats.distributed.ordered connects). Workers load
    `worker_model` (a name or path every node has; default: `model`, shipped through the object store) and are
    checked to have loaded `model`'s name and shape; they stop when the generator ends or is closed."""
    pool = Pool(model if worker_model is None else worker_model, model, shape(workers, threads),
                f"{name}-{uuid.uuid4().hex[:8]}", task)
    for i, info in enumerate(pool.infos):
        log.info("Ray worker %d: pid %d on %s, %d threads", i, info["pid"], info["host"], info["threads"])
    try:
        yield from in_order(pool, iter(items), ray.put(work))
    finally:
        pool.close()


def in_order(pool: Pool, items: Iterator[tuple[K, Any]], work: Any) -> Iterator[tuple[K, Any]]:
    """Keep every worker busy; yield (key, result) in the items' order as soon as each is next."""
    order: deque[K] = deque()  # keys sent and not yet yielded, in the items' order
    early: dict[Any, Any] = {}  # done, waiting for an earlier item
    pending = True
    while pending or order:
        while pending and pool.room and len(order) < WINDOW * len(pool.alive):
            nxt = next(items, None)
            if nxt is None:
                pending = False
                break
            order.append(nxt[0])
            pool.submit(nxt[0], nxt[1], work)
        if pool.jobs:
            early.update(pool.next_done(work))
        while order and order[0] in early:
            key = order.popleft()
            yield key, early.pop(key)


__all__ = ["WINDOW", "in_order", "ordered"]
