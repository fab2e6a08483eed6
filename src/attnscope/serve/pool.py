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


class Cancelled(Exception):
    """A job stopped at one of its checkpoints because its client left or its deadline passed."""


def checkpoint(stop: threading.Event) -> None:
    """Where a running job may stop: raise Cancelled once `stop` is set."""
    if stop.is_set():
        raise Cancelled("stopped: the client left or the deadline passed")


class InferencePool:
    """Run blocking jobs on `workers` threads with at most `queue` more waiting."""

    def __init__(self, workers: int, queue: int, timeout: float) -> None:
        self.workers = workers
        self.capacity = workers + queue
        self.timeout = timeout
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="attnscope-inference")
        self._lock = threading.Lock()
        self._pending = 0  # submitted and not finished (queued or running)
        self.dropped = 0  # jobs cancelled before they started (their client left or the deadline passed)

    @property
    def pending(self) -> int:
        with self._lock:
            return self._pending

    def stats(self) -> dict[str, int | float]:
        pending = self.pending
        return {"workers": self.workers, "capacity": self.capacity, "pending": pending,
                "running": min(pending, self.workers), "waiting": max(0, pending - self.workers),
                "timeout": self.timeout, "dropped": self.dropped}

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args, stop) on a worker; PoolBusy when full, PoolTimeout past the deadline.

        If the caller is cancelled (its client left) or the deadline passes, a queued job never
        starts and a running one sees `stop` set at its next `checkpoint`.
        """
        with self._lock:
            if self._pending >= self.capacity:
                raise PoolBusy(f"the server is busy: {self._pending} requests are queued or running")
            self._pending += 1
        stop = threading.Event()
        fut = self._executor.submit(fn, *args, stop)
        fut.add_done_callback(self._release)  # a slot is freed only when the job has really ended
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), self.timeout)
        except TimeoutError as exc:
            raise PoolTimeout(f"the request took longer than {self.timeout:g} s") from exc
        finally:
            if not fut.done():
                stop.set()
                fut.cancel()  # drops it if still queued; a running one stops at its next checkpoint

    def _release(self, fut: Future[Any]) -> None:
        with self._lock:
            self._pending -= 1
            self.dropped += fut.cancelled()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
