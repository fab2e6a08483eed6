"""A deadline for a request's headers, which uvicorn does not keep, and the connection cap as JSON.

A client that opens a connection and sends its headers a byte at a time (or nothing at all) would
hold the connection (and its buffers) for ever; like nginx's `client_header_timeout`, the headers of
each request must be complete within `header_timeout` seconds of the connection opening, or
of the first bytes of a later request on a kept-alive connection, or the connection is closed.
(An idle kept-alive connection is closed by uvicorn's own keep-alive timeout.) So sockets opened
and left silent hold a slot of the cap for `header_timeout` seconds at most.

At `max_connections` open connections (this one counted) a request gets a JSON 503 with
Retry-After and X-Request-Id, like every other refusal, where uvicorn's own cap answers plain text.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from attnscope.serve.guard import error_response

log = logging.getLogger(__name__)


class HeaderDeadlineProtocol(H11Protocol):  # type: ignore[misc]
    """uvicorn's h11 protocol with a header deadline; `header_timeout` is set by `protocol()`."""

    header_timeout = 60.0
    max_connections: int | None = None
    _headers_late: asyncio.TimerHandle | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limit_concurrency = None  # uvicorn's cap answers plain text: the cap is kept by _capped instead
        if self.max_connections is not None:
            self.app = _capped(self, self.app, self.max_connections)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the headers are in (or the connection is done)
            self._disarm()
        elif self._headers_late is None:  # a later request has begun: its headers get their own deadline
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._headers_late = self.loop.call_later(self.header_timeout, self._close_late)

    def _disarm(self) -> None:
        if self._headers_late is not None:
            self._headers_late.cancel()
            self._headers_late = None

    def _close_late(self) -> None:
        self._headers_late = None
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            log.info("closing a connection whose headers took over %g s", self.header_timeout)
            self.transport.close()


def _capped(conn: HeaderDeadlineProtocol, app: Any, cap: int) -> Any:
    """The app, or a JSON 503 when `cap` connections are open or `cap` requests are running (as uvicorn counts)."""
    async def capped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or (len(conn.connections) < cap and len(conn.tasks) < cap):
            await app(scope, receive, send)
            return
        rid = secrets.token_hex(6)
        log.warning("refused a request at the connection cap of %d (id %s)", cap, rid)
        await error_response(send, 503, f"the server has {cap} connections open, its limit (--max-connections): "
                             f"retry in a moment (request id {rid})", request_id=rid)

    return capped


def protocol(header_timeout: float, max_connections: int | None = None) -> type[Any]:
    """The protocol class to give uvicorn (`Config(http=...)`) for this deadline and connection cap."""
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,),
                {"header_timeout": header_timeout, "max_connections": max_connections})
