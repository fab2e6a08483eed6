"""What a server serves and the limits it keeps: one frozen value, passed to `create_app`."""

from __future__ import annotations

from dataclasses import dataclass

from attnscope.errors import AttnscopeError


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
    workers: int = 1  # inference threads; one model runs one forward pass at a time
    threads: int | None = 1  # torch threads per process (None: torch's default); 1 avoids spinning on shared CPUs
    queue: int = 32  # requests that may wait for a worker; beyond this, 503
    timeout: float = 30.0  # seconds a request may take, waiting included; beyond this, 504
    cache_entries: int = 16  # recent traces kept, so switching layers, heads and tokens is instant
    cache_bytes: int = 512 * 2**20  # and at most this many bytes of arrays

    def __post_init__(self) -> None:
        _at_least("max_chars", self.max_chars, 1)
        _at_least("max_tokens", self.max_tokens, 2)
        _at_least("max_body_bytes", self.max_body_bytes, 1024)
        _at_least("workers", self.workers, 1)
        if self.threads is not None:
            _at_least("threads", self.threads, 1)
        _at_least("queue", self.queue, 0)
        _at_least("cache_entries", self.cache_entries, 0)
        _at_least("cache_bytes", self.cache_bytes, 0)
        if not self.timeout > 0:
            raise AttnscopeError(f"timeout must be a positive number of seconds, got {self.timeout}")


def _at_least(name: str, value: int, low: int) -> None:
    if not isinstance(value, int) or value < low:
        raise AttnscopeError(f"{name} must be an integer of at least {low}, got {value!r}")
