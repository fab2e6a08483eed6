"""The wheel on its own: installed into a fresh virtual environment outside the repo, used from another directory."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

import attnscope

REPO = Path(__file__).resolve().parents[2]
CONSTRAINTS = REPO / "constraints.txt"


def _run(*cmd: str | Path, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel `make dist` built, or one built here."""
    given = request.config.getoption("--wheel-dir")
    where = Path(given).resolve() if given else tmp_path_factory.mktemp("dist")
    if not given:
        _run(sys.executable, "-m", "build", "--wheel", "--outdir", where, REPO, cwd=where)
    wheels = sorted(where.glob(f"attnscope-{attnscope.__version__}-*.whl"))
    assert wheels, f"no attnscope wheel in {where}: run `make dist`"
    return wheels[-1]


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (no system packages) with the pinned CPU torch and the wheel: its bin directory."""
    env_dir = tmp_path_factory.mktemp("wheel-venv") / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    _run(py, "-m", "pip", "install", "-q", "-c", CONSTRAINTS, "torch==2.13.0", cwd=env_dir)
    _run(py, "-m", "pip", "install", "-q", "-c", CONSTRAINTS, wheel, cwd=env_dir)
    return env_dir / "bin"


def test_the_wheel_works_outside_the_repo(installed: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    version = _run(installed / "attnscope", "--version", cwd=elsewhere).stdout
    assert version.strip() == f"attnscope {attnscope.__version__}"
    checked = _run(installed / "attnscope", "check", "time flies like an arrow", cwd=elsewhere).stdout
    assert "PASS" in checked
    _run(installed / "attnscope", "view", "time flies like an arrow", "-o", "x.html", cwd=elsewhere)
    page = (elsewhere / "x.html").read_text(encoding="utf-8")
    assert "window.attnscope" in page and "flies" in page and "<script src=" not in page  # assets inlined
    code = ("import attnscope, pathlib; tr = attnscope.trace('time flies like an arrow'); "
            "assert tr.check().ok; print(pathlib.Path(attnscope.__file__).parent)")
    where = _run(installed / "python", "-c", code, cwd=elsewhere).stdout.strip()
    assert Path(where).is_relative_to(installed.parent) and not Path(where).is_relative_to(REPO)
