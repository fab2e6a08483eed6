"""A bounded load test: 300 requests from 16 concurrent clients, valid and invalid mixed, against the real server."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from tests.support.serve import ARTIFACTS, MAX_BODY, Server

REQUESTS = 300
CLIENTS = 16
WORDS = ("the", "cat", "sat", "on", "a", "mat", "while", "time", "flies", "like", "an", "arrow", "and", "fruit",
         "banana")


@dataclass(frozen=True)
class Call:
    kind: str
    method: str
    path: str
    body: bytes | None
    expect: int


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))


def plan(seed: int = 0) -> list[Call]:
    """A fixed mix: about half valid (traces, payloads, explanations), half refusals of every kind."""
    rng = random.Random(seed)
    texts = [sentence(rng) for _ in range(60)]  # repeats hit the cache, new ones run the model

    def j(body: Any) -> bytes:
        return json.dumps(body).encode()

    makers = [
        lambda: Call("trace", "POST", "/api/trace", j({"text": rng.choice(texts)}), 200),
        lambda: Call("payload", "POST", "/api/trace",
                     j({"text": rng.choice(texts), "stages": [], "payload": True}), 200),
        lambda: Call("explain", "POST", "/api/explain", j({"text": rng.choice(texts), "layer": rng.randrange(6),
                                                           "head": rng.randrange(12), "token": 1}), 200),
        lambda: Call("bad json", "POST", "/api/trace", b'{"text": "unterminated', 422),
        lambda: Call("bad type", "POST", "/api/explain", j({"text": "a", "layer": "two"}), 422),
        lambda: Call("unknown field", "POST", "/api/trace", j({"text": "a", "txet": "b"}), 422),
        lambda: Call("out of range", "POST", "/api/explain", j({"text": "two words", "token": 30}), 422),
        lambda: Call("too large", "POST", "/api/trace", j({"text": "x" * (MAX_BODY + 1)}), 413),
        lambda: Call("wrong method", "GET", "/api/explain", None, 405),
    ]
    weights = [3, 1, 2, 1, 1, 1, 1, 1, 1]
    return [rng.choices(makers, weights)[0]() for _ in range(REQUESTS)]


async def fire(url: str, calls: list[Call]) -> list[tuple[Call, int, float]]:
    results: list[tuple[Call, int, float]] = []
    queue: asyncio.Queue[Call] = asyncio.Queue()
    for c in calls:
        queue.put_nowait(c)
    limits = httpx.Limits(max_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def worker() -> None:
            while not queue.empty():
                c = queue.get_nowait()
                started = time.perf_counter()
                headers = {"Content-Type": "application/json"} if c.body is not None else None
                r = await client.request(c.method, c.path, content=c.body, headers=headers)
                results.append((c, r.status_code, time.perf_counter() - started))

        await asyncio.gather(*(worker() for _ in range(CLIENTS)))
    return results


def test_load_mixed_bodies_no_5xx_and_healthy_after(server: Server) -> None:
    calls = plan()
    started = time.perf_counter()
    results = asyncio.run(fire(server.url, calls))
    wall = time.perf_counter() - started
    assert len(results) == REQUESTS
    server_errors = [(c.kind, status) for c, status, _ in results if status >= 500]
    assert server_errors == []
    wrong = [(c.kind, c.expect, status) for c, status, _ in results if status != c.expect]
    assert wrong == []
    health = server.health()
    assert health["status"] == "ok" and health["pool"]["pending"] == 0

    latency = np.array([t for _, _, t in results]) * 1000
    valid = np.array([t for c, _, t in results if c.expect == 200]) * 1000
    figures = {
        "requests": REQUESTS, "clients": CLIENTS, "wall_s": round(wall, 2), "requests_per_s": round(REQUESTS / wall, 1),
        "p50_ms": round(float(np.percentile(latency, 50)), 1), "p95_ms": round(float(np.percentile(latency, 95)), 1),
        "valid": int(valid.size), "valid_p50_ms": round(float(np.percentile(valid, 50)), 1),
        "valid_p95_ms": round(float(np.percentile(valid, 95)), 1),
        "statuses": {str(s): sum(1 for _, st, _ in results if st == s) for s in sorted({st for _, st, _ in results})},
        "cache": health["cache"],
    }
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "load.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    print(f"\nload test: {REQUESTS} requests, {CLIENTS} concurrent, {figures['requests_per_s']} req/s; "
          f"p50 {figures['p50_ms']} ms, p95 {figures['p95_ms']} ms; valid ({figures['valid']}): "
          f"p50 {figures['valid_p50_ms']} ms, p95 {figures['valid_p95_ms']} ms; statuses {figures['statuses']}")
