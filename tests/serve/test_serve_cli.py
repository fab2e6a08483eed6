"""`attnscope serve` refusals: a wrong port, a taken port, bad limits; a warning off loopback."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from attnscope.cli.main import main
from attnscope.cli.serve import is_loopback


@dataclass
class Done:
    returncode: int
    stderr: str


Run = Callable[..., "Done"]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    """`attnscope serve ARGS` through the CLI's own main(), in this process (each case fails before serving)."""
    def run_(*args: str) -> Done:
        code = main(["serve", *args])
        return Done(code, capsys.readouterr().err)

    return run_


def test_binding_beyond_loopback_warns_and_a_bad_port_is_one_line(run: Run) -> None:
    done = run("--host", "0.0.0.0", "--port", "70000")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith("attnscope: warning: listening on 0.0.0.0")
    assert lines[-1] == "attnscope: error: --port 70000 is not a port: use 0..65535"


def test_a_taken_port_fails_before_loading_anything(run: Run) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run("--port", str(port))
    assert done.returncode == 2
    assert done.stderr.strip().endswith("pick another --port")
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "warning" not in done.stderr


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--workers", "0", "--workers must be an integer of at least 1, got 0"),
    ("--timeout", "0", "--timeout must be a positive number of seconds, got 0.0"),
    ("--max-tokens", "1", "--max-tokens must be an integer of at least 2, got 1"),
    ("--max-body", "10", "--max-body must be an integer of at least 1024, got 10"),
    ("--header-timeout", "-1", "--header-timeout must be a positive number of seconds, got -1.0"),
    ("--max-connections", "0", "--max-connections must be an integer of at least 1, got 0"),
    ("--max-memory", "0", "--max-memory must be at least 1 (MiB), got 0"),
    ("--token", "short", "--token must be at least 8 characters long"),
    ("--allow-host", "*", "--allow-host '*' answers any Host"),
])
def test_bad_limits_are_one_line_errors(run: Run, flag: str, value: str, message: str) -> None:
    done = run(flag, value)
    assert done.returncode == 2 and done.stderr.strip().startswith(f"attnscope: error: {message}")


@pytest.mark.parametrize(("host", "local"), [("127.0.0.1", True), ("localhost", True), ("::1", True),
                                             ("127.0.0.2", True), ("0.0.0.0", False), ("::", False),
                                             ("192.168.1.5", False), ("example.org", False)])
def test_loopback_detection(host: str, local: bool) -> None:
    assert is_loopback(host) is local
