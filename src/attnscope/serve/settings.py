"""What a server serves and the limits it keeps: one frozen value, passed to `create_app`."""

from __future__ import annotations

from dataclasses import dataclass

from attnscope.errors import AttnscopeError

# Host names a loopback server answers to (with its port), whatever --host says.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


@dataclass(frozen=True)
class Settings:
    """Models and limits of one `attnscope serve`.

    models: names or local paths; the first is the default; empty means the bundled
    all-MiniLM-L6-v2. A request may only name a model served here.
    """

    models: tuple[str, ...] = ()
    max_chars: int = 10_000  # per text, in characters (Unicode code points)
    max_tokens: int = 256  # per trace, special tokens included; longer text is truncated or refused
    max_body_bytes: int = 256 * 1024  # a larger request body gets 413
    workers: int = 2  # inference threads: one forward pass per model at a time; another encodes meanwhile
    threads: int | None = 1  # torch threads per process (None: torch's default); 1 avoids spinning on shared CPUs
    queue: int = 32  # requests that may wait for a worker; beyond this, 503
    timeout: float = 30.0  # seconds a request may take, waiting included; beyond this, 504
    cache_entries: int = 16  # recent traces kept, so switching layers, heads and tokens is instant
    cache_bytes: int = 512 * 2**20  # and at most this many bytes: arrays, derived arrays and payloads
    allow_hosts: tuple[str, ...] = ()  # Host names beyond LOOPBACK_HOSTS ("name" or "name:port"; "*": any)
    token: str | None = None  # when set, every request must carry it (?token=, a cookie or a header)
    header_timeout: float = 60.0  # seconds to receive a request's headers; then the connection is closed
    body_timeout: float = 60.0  # seconds to receive a request's body once its headers are in; then 408
    max_connections: int = 64  # open connections; a request beyond this gets 503
    max_response_bytes: int = 128 * 2**20  # a response larger than this is refused (422) before it is built
    max_list_values: int = 2**20  # numbers sent with "encoding": "list" (nested JSON lists are ~4x base64)
    max_memory_bytes: int = 4 * 2**30  # resident memory ceiling: beyond it the cache is emptied, then 503

    def __post_init__(self) -> None:
        for name, low in (("max_chars", 1), ("max_tokens", 2), ("max_body_bytes", 1024), ("workers", 1),
                          ("queue", 0), ("cache_entries", 0), ("cache_bytes", 0), ("max_connections", 1),
                          ("max_response_bytes", 1024), ("max_list_values", 1), ("max_memory_bytes", 2**20)):
            _at_least(name, getattr(self, name), low)
        if self.threads is not None:
            _at_least("threads", self.threads, 1)
        for name in ("timeout", "header_timeout", "body_timeout"):
            value = getattr(self, name)
            if not value > 0:
                raise AttnscopeError(f"{name} must be a positive number of seconds, got {value}", parameter=name)
        if self.token is not None and len(self.token) < 8:
            raise AttnscopeError("token must be at least 8 characters long", parameter="token")


def _at_least(name: str, value: int, low: int) -> None:
    if not isinstance(value, int) or value < low:
        raise AttnscopeError(f"{name} must be an integer of at least {low}, got {value!r}", parameter=name)
