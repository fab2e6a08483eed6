"""Helpers for the web app tests: real `attnscope serve` processes on loopback, and API array decoding."""

from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "serve"
# The shared server's limits: small, so every test (and schemathesis) stays fast.
MAX_TOKENS = 32
MAX_CHARS = 2000
MAX_BODY = 16 * 1024
_URL = re.compile(r"serving .* on (http://\S+/)(?:\?token=(\S+))?")


@dataclass
class Server:
    """One `attnscope serve` child process and what it printed."""

    process: subprocess.Popen[str]
    url: str
    stderr: list[str] = field(default_factory=list)
    token: str | None = None  # the access token printed in the start-up URL, if any

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"} if self.token else {}

    @property
    def port(self) -> int:
        return int(self.url.rstrip("/").rsplit(":", 1)[1])

    def client(self, timeout: float = 60.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout, headers=self.auth)

    def health(self) -> dict[str, Any]:
        return dict(httpx.get(self.url + "healthz", timeout=10, headers=self.auth).json())

    def stop(self) -> int:
        """Ctrl-C, as a person would; uvicorn shuts down gracefully."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return int(self.process.returncode)


def serve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "attnscope.cli.main", "serve", *args]


def start_server(*args: str, timeout: float = 120.0) -> Server:
    """`attnscope serve --port 0 ARGS`, waiting until it prints its URL and /healthz answers."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(serve_command("--port", "0", *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    server = Server(proc, "")
    threading.Thread(target=lambda: server.stderr.extend(proc.stderr), daemon=True).start()  # type: ignore[arg-type]
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        found = _URL.search(line)
        if found:
            server.url, server.token = found.group(1), found.group(2)
            break
    if not server.url:
        proc.wait(timeout=10)
        raise RuntimeError(f"attnscope serve did not start: {''.join(server.stderr)[-2000:]}")
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    while time.monotonic() < deadline:
        try:
            if httpx.get(server.url + "healthz", timeout=5, headers=server.auth).status_code in (200, 503):
                return server
        except httpx.TransportError:
            time.sleep(0.2)
    server.stop()
    raise RuntimeError("attnscope serve printed its URL but /healthz never answered")


def served(*args: str) -> Iterator[Server]:
    """A fixture's server: start_server(*args) yielded, then stopped (Ctrl-C) and checked: exit 0, no traceback."""
    s = start_server(*args)
    yield s
    assert s.stop() == 0, "".join(s.stderr)[-2000:]
    assert "Traceback" not in "".join(s.stderr), "".join(s.stderr)[-4000:]


def decode(array: dict[str, Any]) -> np.ndarray:
    """An API array: base64 of little-endian float32 in C order, or nested lists."""
    if array["encoding"] == "list":
        return np.asarray(array["data"], dtype=np.float32)
    raw = base64.b64decode(array["data"])
    return np.frombuffer(raw, dtype="<f4").reshape(array["shape"])
