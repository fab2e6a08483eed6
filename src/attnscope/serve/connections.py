"""A deadline for a request's headers, which uvicorn does not keep.

A client that opens a connection and sends its headers a byte at a time would hold the
connection (and its buffers) for ever; like nginx's `client_header_timeout`, the headers of
each request must be complete within `header_timeout` seconds of the connection opening, or
of the first bytes of a later request on a kept-alive connection, or the connection is closed.
(An idle kept-alive connection is closed by uvicorn's own keep-alive timeout.)
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


class HeaderDeadlineProtocol(H11Protocol):  # type: ignore[misc]
    """uvicorn's h11 protocol with a header deadline; `header_timeout` is set by `protocol()`."""

    header_timeout = 60.0
    _headers_late: asyncio.TimerHandle | None = None

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


def protocol(header_timeout: float) -> type[Any]:
    """The protocol class to give uvicorn (`Config(http=...)`) for this deadline."""
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"header_timeout": header_timeout})
