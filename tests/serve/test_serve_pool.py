"""The inference pool and the trace cache, in process, with real threads and real traces."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import attnscope
from attnscope.serve.cache import Entry, TraceCache
from attnscope.serve.pool import InferencePool, PoolBusy, PoolTimeout


def test_pool_queues_then_refuses_and_frees_slots_when_jobs_end() -> None:
    async def scenario() -> None:
        pool = InferencePool(workers=1, queue=1, timeout=30)
        gate = threading.Event()
        running = asyncio.create_task(pool.run(lambda _stop: gate.wait(30)))
        queued = asyncio.create_task(pool.run(lambda _stop: 42))
        await asyncio.sleep(0.05)
        assert pool.stats()["running"] == 1 and pool.stats()["waiting"] == 1
        with pytest.raises(PoolBusy):
            await pool.run(lambda _stop: 0)
        gate.set()
        assert await running is True
        assert await queued == 42
        assert pool.pending == 0
        pool.shutdown()

    asyncio.run(scenario())


def test_pool_deadline_covers_waiting_and_keeps_the_slot_until_the_job_ends() -> None:
    async def scenario() -> None:
        pool = InferencePool(workers=1, queue=4, timeout=0.2)
        gate = threading.Event()
        with pytest.raises(PoolTimeout):
            await pool.run(lambda _stop: gate.wait(30))
        with pytest.raises(PoolTimeout):  # queued behind it: dropped unstarted at its own deadline
            await pool.run(lambda _stop: 1)
        assert pool.pending == 1  # the running job is not killed, and still counts
        gate.set()
        for _ in range(200):
            if pool.pending == 0:
                break
            time.sleep(0.01)
        assert pool.pending == 0
        assert await pool.run(lambda _stop: 7) == 7
        pool.shutdown()

    asyncio.run(scenario())


def entry(text: str, model: attnscope.Model) -> Entry:
    tr = attnscope.trace(text, model=model, max_length=16)
    return Entry(tr, tr.check().to_dict())


def test_cache_evicts_least_recently_used_by_count_and_bytes(minilm: attnscope.Model) -> None:
    a, b, c = (entry(t, minilm) for t in ("one", "two words", "three small words"))
    cache = TraceCache(max_entries=2, max_bytes=10**9)
    key = lambda e: (minilm.name, e.trace.text, None, 16, True)  # noqa: E731
    cache.put(key(a), a)
    cache.put(key(b), b)
    assert cache.get(key(a)) is a  # a is now the most recent
    cache.put(key(c), c)
    assert cache.get(key(b)) is None and cache.get(key(a)) is a and cache.get(key(c)) is c
    small = TraceCache(max_entries=10, max_bytes=a.nbytes + c.nbytes - 1)
    small.put(key(a), a)
    small.put(key(c), c)
    assert small.get(key(a)) is None and small.get(key(c)) is c
    assert small.stats()["bytes"] == c.nbytes
