"""A bounded pool for model inference: a few worker threads, a short queue, a deadline per request.

Concurrent requests wait in the queue rather than each holding a forward pass in memory;
when the queue is full a request is refused at once (503) instead of piling up.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class PoolBusy(Exception):
    """Every worker is busy and the queue is full."""


class PoolTimeout(Exception):
    """A request waited and ran longer than the deadline."""


class InferencePool:
    """Run blocking jobs on `workers` threads with at most `queue` more waiting."""

    def __init__(self, workers: int, queue: int, timeout: float) -> None:
        self.workers = workers
        self.capacity = workers + queue
        self.timeout = timeout
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="attnscope-inference")
        self._lock = threading.Lock()
        self._pending = 0  # submitted and not finished (queued or running)

    @property
    def pending(self) -> int:
        with self._lock:
            return self._pending

    def stats(self) -> dict[str, int | float]:
        pending = self.pending
        return {"workers": self.workers, "capacity": self.capacity, "pending": pending,
                "running": min(pending, self.workers), "waiting": max(0, pending - self.workers),
                "timeout": self.timeout}

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on a worker; PoolBusy when full, PoolTimeout past the deadline."""
        with self._lock:
            if self._pending >= self.capacity:
                raise PoolBusy(f"the server is busy: {self._pending} requests are queued or running")
            self._pending += 1
        fut = self._executor.submit(fn, *args)
        fut.add_done_callback(self._release)  # a slot is freed only when the job has really ended
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), self.timeout)
        except TimeoutError as exc:
            fut.cancel()  # drops it if still queued; a running forward pass finishes on its own
            raise PoolTimeout(f"the request took longer than {self.timeout:g} s") from exc

    def _release(self, _fut: Future[Any]) -> None:
        with self._lock:
            self._pending -= 1

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
