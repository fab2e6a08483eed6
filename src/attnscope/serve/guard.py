"""The guard around every endpoint: who may ask, in what form, and how long a body may take.

One ASGI middleware, so an endpoint added later is covered without doing anything:
- Host must name this server (127.0.0.1, localhost or [::1] with its port, or an allowed host):
  a page on a DNS-rebinding domain reaches the server with its own Host and gets 403;
- a request with an Origin must come from the server's own origin (403 otherwise), and a CORS
  preflight is refused (403), so no other site's script can call the API;
- a body must be `application/json` (415 otherwise): browsers send text/plain and form bodies
  cross-site without a preflight, never JSON;
- with an access token, every request carries it (`?token=`, the cookie that sets, or an
  `Authorization: token ...` header), else 403;
- the body must arrive within `body_timeout` seconds (408);
- no response is larger than `max_response_bytes`: endpoints refuse such requests (422) before
  building anything; if one is built anyway, the client gets a 500, or a cut stream;
- every response carries an `X-Request-Id`; an unexpected exception is logged with it and the
  client reads only "internal error" and the id, never the exception; a client that hangs up
  mid-body is not an error (one info line).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
import time
from collections.abc import Iterable
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import ClientDisconnect

from attnscope.numbers import is_count
from attnscope.serve.fields import RequestError
from attnscope.serve.settings import LOOPBACK_HOSTS, Settings

log = logging.getLogger(__name__)
Scope = dict[str, Any]
Message = dict[str, Any]
COOKIE = "attnscope_token"
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class ResponseTooLarge(Exception):
    """An endpoint built a response over the budget it should have refused beforehand (a bug)."""


class Guard:
    """ASGI middleware: the checks above, then the app; refusals are one-line JSON errors."""

    def __init__(self, app: Any, settings: Settings) -> None:
        self.app = app
        self.names = frozenset(h.lower() for h in (*LOOPBACK_HOSTS, *settings.allow_hosts))
        self.token = settings.token
        self.body_timeout = settings.body_timeout
        self.max_response = settings.max_response_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = secrets.token_hex(6)
        scope.setdefault("state", {})["request_id"] = rid
        started, sent = False, 0
        cookie = self._cookie(scope)

        async def send_with_id(message: Message) -> None:
            nonlocal started, sent
            if message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
                if sent > self.max_response:
                    raise ResponseTooLarge(f"the response passed {self.max_response} bytes")
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                declared = dict(headers).get(b"content-length", b"0")
                if declared.isdigit() and int(declared) > self.max_response:  # bytes: ASCII digits only
                    raise ResponseTooLarge(f"the response is {int(declared)} bytes, over {self.max_response}")
                started = True
                headers.append((b"x-request-id", rid.encode()))
                if cookie:
                    headers.append((b"set-cookie", cookie.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            self.validate(scope)
            await self.app(scope, self._deadline(receive), send_with_id)
        except RequestError as exc:
            if not started:
                await error_response(send_with_id, exc.status, exc.message)
        except ClientDisconnect:  # the client hung up mid-body: nobody to answer, nothing went wrong here
            log.info("the client left during request %s %s (id %s)", scope["method"], scope["path"], rid)
        except Exception as exc:  # the one place an unexpected error becomes a 500
            log.error("internal error in request %s %s (id %s)", scope["method"], scope["path"], rid, exc_info=exc)
            if not started:
                await error_response(send_with_id, 500, f"internal error (request id {rid})")

    def validate(self, scope: Scope) -> None:
        """Raise RequestError for a request from anyone but this server's own pages and local clients."""
        headers = _headers(scope["headers"])
        host = headers.get("host", "")
        if not self.host_allowed(host, scope.get("server")):
            raise RequestError(403, f"Host {host[:64]!r} is not this server: open it as http://127.0.0.1:PORT/ "
                               "or allow that name with --allow-host")
        origin = headers.get("origin")
        if origin is not None and origin != f"{scope.get('scheme', 'http')}://{host}":
            raise RequestError(403, f"requests from {origin[:64]!r} are not allowed: use this server's own page")
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            raise RequestError(403, "cross-origin requests are not allowed: use this server's own page")
        if self.token is not None and not self._has_token(scope, headers):
            raise RequestError(403, "this server needs its access token: open the URL it printed at start-up "
                               "(with ?token=...) or send the header 'Authorization: token ...'")
        if scope["method"] in BODY_METHODS:
            media = headers.get("content-type", "").split(";")[0].strip().lower()
            if media != "application/json":
                raise RequestError(415, f"the body must be JSON sent as Content-Type: application/json, "
                                   f"not {media[:64] or 'no Content-Type'!r}")

    def host_allowed(self, host: str, server: tuple[str, int] | None) -> bool:
        """`name:port` with an allowed name and this server's port (no port: port 80)."""
        if "*" in self.names:
            return True
        name, port = _split_host(host.lower())
        own = server[1] if server else None
        return (name in self.names and port == own) or f"{name}:{port}" in self.names

    def _has_token(self, scope: Scope, headers: dict[str, str]) -> bool:
        assert self.token is not None
        given = [*parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token", [])]
        auth = headers.get("authorization", "")
        if auth.lower().startswith(("token ", "bearer ")):
            given.append(auth.split(" ", 1)[1].strip())
        jar = SimpleCookie()
        try:
            jar.load(headers.get("cookie", ""))
        except CookieError:  # an unreadable Cookie header holds no token
            jar = SimpleCookie()
        if COOKIE in jar:
            given.append(jar[COOKIE].value)
        return any(hmac.compare_digest(g.encode(), self.token.encode()) for g in given)

    def _cookie(self, scope: Scope) -> str | None:
        """The token's cookie, set when the token came in the URL (the start-up link), as Jupyter does."""
        if self.token is None or b"token=" not in scope.get("query_string", b""):
            return None
        return f"{COOKIE}={self.token}; Path=/; HttpOnly; SameSite=Strict"

    def _deadline(self, receive: Any) -> Any:
        """receive(), but the body must be complete within body_timeout seconds of the first read."""
        deadline: float | None = None
        done = False

        async def receive_in_time() -> Message:
            nonlocal deadline, done
            if done:  # past the body, receive() waits for a disconnect: no deadline
                return dict(await receive())
            deadline = deadline or time.monotonic() + self.body_timeout
            try:
                message = dict(await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic())))
            except TimeoutError as exc:
                raise RequestError(408, f"the body did not arrive within {self.body_timeout:g} s: "
                                   "send it at once") from exc
            done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        return receive_in_time


def _headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw}


def _split_host(host: str) -> tuple[str, int | None]:
    """("name", port) of a Host header; [::1]:8000 keeps its brackets."""
    if host.startswith("["):
        name, _, rest = host.partition("]")
        name += "]"
        port = rest[1:] if rest.startswith(":") else ""
    else:
        name, _, port = host.partition(":")
    if not port:
        return name, 80
    return (name, int(port)) if is_count(port) and len(port) <= 5 else (name, None)


async def error_response(send: Any, status: int, message: str, request_id: str | None = None) -> None:
    """A one-line JSON error, sent straight from the middleware (or from the connection cap, with its own id)."""
    body = json.dumps({"error": message}, ensure_ascii=False, separators=(",", ":")).encode("utf-8")  # as the app's
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 408 or request_id is not None:  # a slow body, or a refusal at the connection cap: free the slot
        headers.append((b"connection", b"close"))
    if status == 503:
        headers.append((b"retry-after", b"1"))
    if request_id is not None:
        headers.append((b"x-request-id", request_id.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
