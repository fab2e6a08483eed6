"""serve: the local web app and JSON API (needs the `serve` extra)."""

from __future__ import annotations

import argparse
import ipaddress
import secrets
import socket
import sys
from typing import Any

from attnscope.cli.common import integer, real
from attnscope.errors import AttnscopeError

LOOPBACK = "127.0.0.1"


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="a local web page and JSON API to trace, view and explain attention")
    p.add_argument("--host", default=LOOPBACK, help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=integer, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--model", metavar="M", nargs="+", action="extend", default=None,
                   help="models to serve, the first is the default (default: the bundled all-MiniLM-L6-v2)")
    p.add_argument("--max-tokens", type=integer, default=256, metavar="N", help="tokens per trace (default 256)")
    p.add_argument("--max-chars", type=integer, default=10_000, metavar="N",
                   help="characters per text (default 10000)")
    p.add_argument("--max-body", type=integer, default=256 * 1024, metavar="BYTES",
                   help="request body limit; larger bodies get 413 (default 262144)")
    p.add_argument("--workers", type=integer, default=2,
                   help="inference workers: one forward pass per model at a time, while another worker encodes "
                        "an answer or serves a cached trace (default 2)")
    p.add_argument("--threads", type=integer, default=1,
                   help="torch threads for the whole server (default 1: fastest where the CPU is shared; "
                        "0 keeps torch's default)")
    p.add_argument("--queue", type=integer, default=32, help="requests that may wait; beyond, 503 (default 32)")
    p.add_argument("--timeout", type=real, default=30.0, metavar="SECONDS",
                   help="per-request deadline, waiting included; beyond, 504 (default 30)")
    p.add_argument("--cache", type=integer, default=16, metavar="N", help="recent traces kept (default 16)")
    p.add_argument("--index", metavar="INDEX", default=None,
                   help="a corpus index built by `attnscope index`: POST /api/search and the page's corpus search "
                        "(without --model, the index's model is served); also POST /api/qkmap and the page's "
                        "query/key map")
    p.add_argument("--heads", metavar="DIR", default=None,
                   help="a directory written by `attnscope heads`: /api/heads and the page's heads panel, a click on "
                        "a head opening it in the views (without --model, its model is served)")
    add_guard_args(p)
    p.set_defaults(func=run_serve)


def add_guard_args(p: Any) -> None:
    """Who may use the server, and the deadlines and budgets that bound it (docs/serve.md)."""
    p.add_argument("--allow-host", metavar="NAME", action="append", default=[],
                   help="also answer to this Host name (NAME or NAME:PORT; '*' for any, only with a token); "
                        "always allowed: 127.0.0.1, localhost, [::1] and --host, on this port")
    p.add_argument("--token", default=None, help="access token every request must carry (default: a random one "
                   "when --host is not loopback, none on loopback)")
    p.add_argument("--no-token", action="store_true", help="no access token even off loopback (not advised)")
    p.add_argument("--header-timeout", type=real, default=60.0, metavar="SECONDS",
                   help="time to send a request's headers; then the connection is closed (default 60)")
    p.add_argument("--body-timeout", type=real, default=60.0, metavar="SECONDS",
                   help="time to send a request's body; then 408 (default 60)")
    p.add_argument("--max-connections", type=integer, default=64, metavar="N",
                   help="open connections; a request beyond gets 503 (default 64)")
    p.add_argument("--max-response", type=integer, default=128, metavar="MIB",
                   help="largest response in MiB; larger ones are refused with 422 (default 128)")
    p.add_argument("--max-list", type=integer, default=2**20, metavar="N",
                   help="numbers a response may send with \"encoding\": \"list\"; beyond, 422 (default 1048576)")
    p.add_argument("--cache-size", type=integer, default=512, metavar="MIB",
                   help="bytes the trace cache may hold, everything counted, in MiB (default 512)")
    p.add_argument("--max-memory", type=integer, default=4096, metavar="MIB",
                   help="resident memory ceiling in MiB: beyond, the cache is emptied, then 503 (default 4096)")


def run_serve(args: argparse.Namespace) -> int:
    try:
        import starlette  # noqa: F401
        import uvicorn
    except ImportError as exc:
        raise AttnscopeError(f"serve needs the serve extra: pip install 'attnscope[serve]' ({exc.name} is missing)"
                             ) from exc
    settings = settings_of(args)
    token = settings.token
    if not is_loopback(args.host):
        guard = "only with the token in the URL below" if token else "with no token (--no-token)"
        print(f"attnscope: warning: listening on {args.host}: anyone who can reach this machine can use the "
              f"server and its CPU, {guard}; use --host 127.0.0.1 to keep it local", file=sys.stderr)
    sock = bind(args.host, args.port)  # before loading models: a taken port fails at once
    from attnscope.serve.app import create_app

    app = create_app(settings, index=args.index, heads=args.heads)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    names = ", ".join(m["name"] for m in app.state.server.service.model_list())
    query = f"?token={token}" if token else ""
    print(f"attnscope: serving {names} on http://{shown}:{port}/{query} (Ctrl-C to stop)", flush=True)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5, **uvicorn_limits(settings))
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:  # Ctrl-C is how a server is stopped: uvicorn has shut down gracefully
        print("attnscope: stopped", file=sys.stderr)
    return 0


def settings_of(args: argparse.Namespace) -> Any:
    """The server's Settings from the flags: a random token off loopback unless --token or --no-token."""
    from attnscope.serve.settings import Settings

    token = None if args.no_token else args.token or (None if is_loopback(args.host) else secrets.token_urlsafe(24))
    if "*" in args.allow_host and token is None:
        raise AttnscopeError("--allow-host '*' answers any Host, so DNS rebinding reaches the server: "
                             "use it with a token (drop --no-token)")
    own_host = f"[{args.host}]" if ":" in args.host else args.host  # as a browser sends it in Host
    models = args.model or dict.fromkeys((*index_models(args.index), *heads_models(args.heads)))
    return Settings(models=tuple(models), max_chars=args.max_chars,
                    max_tokens=args.max_tokens,
                    max_body_bytes=args.max_body, workers=args.workers, threads=args.threads or None,
                    queue=args.queue, timeout=args.timeout, cache_entries=args.cache,
                    allow_hosts=(own_host, *args.allow_host), token=token, header_timeout=args.header_timeout,
                    body_timeout=args.body_timeout, max_connections=args.max_connections,
                    max_response_bytes=_mib("--max-response", args.max_response), max_list_values=args.max_list,
                    cache_bytes=_mib("--cache-size", args.cache_size),
                    max_memory_bytes=_mib("--max-memory", args.max_memory))


def index_models(index: str | None) -> tuple[str, ...]:
    """Without --model: the model the corpus index was built with (its manifest read, torch-free), else none (the
    bundled default)."""
    if index is None:
        return ()
    from attnscope.corpus.store import CorpusIndex

    try:
        return (CorpusIndex(index, verify=False).model,)
    except AttnscopeError as exc:
        raise AttnscopeError(f"--index: {exc}") from exc  # the message names the flag


def heads_models(heads: str | None) -> tuple[str, ...]:
    """Without --model: the model of the heads pass in DIR (its heads.npz read), else none."""
    if heads is None:
        return ()
    from pathlib import Path

    from attnscope.corpus.head_sums import FILE, load

    path = Path(heads)
    try:
        _, meta = load(path / FILE if path.is_dir() else path)
    except AttnscopeError as exc:
        raise AttnscopeError(f"--heads: {exc}") from exc
    return (str(meta["model"]),)


def _mib(flag: str, value: int) -> int:
    if value < 1:
        raise AttnscopeError(f"{flag} must be at least 1 (MiB), got {value}")
    return value * 2**20


def uvicorn_limits(settings: Any) -> dict[str, Any]:
    """uvicorn's side of the limits: the header deadline and the connection cap, a JSON 503 (serve.connections)."""
    from attnscope.serve.connections import protocol

    return {"http": protocol(settings.header_timeout, settings.max_connections), "timeout_keep_alive": 5}


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, so a taken port is one clear error and port 0 gets a real number."""
    if not 0 <= port <= 65535:
        raise AttnscopeError(f"--port {port} is not a port: use 0..65535")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise AttnscopeError(f"--host {host}: cannot resolve it ({exc.strerror})") from exc
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise AttnscopeError(f"cannot listen on {host}:{port}: {exc.strerror}; pick another --port") from exc
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
