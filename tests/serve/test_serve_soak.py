"""A soak of a real server: thousands of valid, hostile and abandoned requests; its memory comes back.

After a warm-up of the same mix (the cache full, every code path run once), the server's resident
memory is read from /healthz; after the soak it must be within 20% of that, with /healthz green.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.support.serve import ARTIFACTS, Server, start_server

WARM_UP = 300
SOAK = 2000
CLIENTS = 24
WORDS = ("the", "cat", "sat", "on", "a", "mat", "while", "time", "flies", "like", "an", "arrow", "fruit", "banana")


@dataclass(frozen=True)
class Call:
    kind: str
    path: str
    body: bytes
    headers: dict[str, str]
    expect: int | None  # None: the client gives up before the answer


def plan(rng: random.Random, n: int, port: int) -> list[Call]:
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14))) for _ in range(24)]
    own = {"Content-Type": "application/json"}

    def j(body: Any) -> bytes:
        return json.dumps(body).encode()

    makers: list[tuple[int, Callable[[], Call]]] = [
        (3, lambda: Call("trace", "/api/trace", j({"text": rng.choice(texts)}), own, 200)),
        (1, lambda: Call("explain", "/api/explain", j({"text": rng.choice(texts), "layer": rng.randrange(6),
                                                       "head": rng.randrange(12)}), own, 200)),
        (1, lambda: Call("payload", "/api/trace", j({"text": rng.choice(texts), "stages": [], "payload": True,
                                                     "sources": ["rollout", "norm_head"]}), own, 200)),
        (2, lambda: Call("rebinding", "/api/explain", j({"text": "x", "layer": 3, "head": 7}),
                         {**own, "Host": f"evil.example:{port}"}, 403)),
        (2, lambda: Call("cross-site", "/api/trace", j({"text": "x"}),
                         {"Content-Type": "text/plain", "Origin": "https://evil.example"}, 403)),
        (2, lambda: Call("text/plain", "/api/trace", j({"text": "x"}), {"Content-Type": "text/plain"}, 415)),
        (1, lambda: Call("bad json", "/api/trace", b'{"text": "unterminated', own, 422)),
        (1, lambda: Call("pair bypass", "/api/trace", j({"text": "a " * 300, "pair": "b", "max_length": 2}), own,
                         422)),
        (1, lambda: Call("huge list", "/api/trace", j({"text": "word " * 40, "stages": ["weights", "scores"],
                                                       "encoding": "list"}), own, 422)),
        (1, lambda: Call("abandoned", "/api/trace", j({"text": f"gone {rng.random()} " + rng.choice(texts),
                                                       "stages": ["q"], "payload": True}), own, None)),
    ]
    weights = [w for w, _ in makers]
    return [rng.choices([m for _, m in makers], weights)[0]() for _ in range(n)]


async def fire(url: str, calls: list[Call]) -> list[tuple[Call, int | None]]:
    results: list[tuple[Call, int | None]] = []
    queue: asyncio.Queue[Call] = asyncio.Queue()
    for c in calls:
        queue.put_nowait(c)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=CLIENTS)) as client:

        async def worker() -> None:
            while not queue.empty():
                c = queue.get_nowait()
                timeout = 0.005 if c.expect is None else 120
                try:
                    r = await client.post(c.path, content=c.body, headers=c.headers, timeout=timeout)
                    results.append((c, r.status_code))
                except httpx.TimeoutException:
                    results.append((c, None))

        await asyncio.gather(*(worker() for _ in range(CLIENTS)))
    return results


def slow_connections(port: int, n: int) -> list[socket.socket]:
    """Clients that start their headers and never finish them (the header deadline closes them)."""
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"POST /api/trace HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        out.append(s)
    return out


@pytest.fixture(scope="module")
def soaked() -> Iterator[Server]:
    s = start_server("--max-tokens", "48", "--queue", "64", "--max-connections", "96", "--header-timeout", "2",
                     "--body-timeout", "2", "--max-list", "20000", "--cache", "32")
    yield s
    assert s.stop() == 0
    assert "Traceback" not in "".join(s.stderr), "".join(s.stderr)[-4000:]


def settle(server: Server) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while (health := server.health())["pool"]["pending"]:
        assert time.monotonic() < deadline, health
        time.sleep(0.1)
    return health


def test_soak_valid_hostile_and_abandoned_memory_comes_back(soaked: Server) -> None:
    rng = random.Random(0)
    warm = asyncio.run(fire(soaked.url, plan(rng, WARM_UP, soaked.port)))
    assert not [s for _, s in warm if s is not None and s >= 500]
    rss_warm = settle(soaked)["memory"]["rss"]

    started = time.perf_counter()
    slow = slow_connections(soaked.port, 24)
    results = asyncio.run(fire(soaked.url, plan(rng, SOAK, soaked.port)))
    wall = time.perf_counter() - started
    for s in slow:
        s.close()
    health = settle(soaked)
    rss_after = health["memory"]["rss"]

    wrong = [(c.kind, c.expect, status) for c, status in results if c.expect is not None and status != c.expect]
    assert wrong == []
    assert not [s for _, s in results if s is not None and s >= 500]
    assert health["status"] == "ok" and health["memory"]["ok"] is True
    assert abs(rss_after - rss_warm) <= 0.2 * rss_warm, (rss_warm >> 20, rss_after >> 20)
    abandoned = sum(1 for c, s in results if c.expect is None and s is None)
    figures = {"requests": SOAK, "clients": CLIENTS, "wall_s": round(wall, 1), "abandoned": abandoned,
               "rss_warm_mib": rss_warm >> 20, "rss_after_mib": rss_after >> 20, "dropped": health["pool"]["dropped"],
               "cache": health["cache"]}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "soak.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    print(f"\nsoak: {SOAK} requests in {wall:.1f} s, {abandoned} abandoned; RSS {rss_warm >> 20} MiB after warm-up, "
          f"{rss_after >> 20} MiB after the soak")
