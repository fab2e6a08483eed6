"""The wheel on its own: installed into a fresh virtual environment outside the repo, used from another directory.

The environment holds the wheel and exactly the distributions its Requires-Dist names (with theirs, recursively):
pip installs the wheel there with --no-index and must find every requirement met. Those distributions are linked
file by file (their RECORD) from the repo's .venv, which installed the same pins: copying torch, scipy and the
bundled model again took over a minute and checked nothing more. A dependency the wheel forgets to declare is
absent there, so the commands below fail on its import.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
import venv
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement

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


def requirements(wheel: Path) -> list[str]:
    """The wheel's own Requires-Dist lines (its METADATA, not the installed checkout's)."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(zf.read(name).decode("utf-8")).get_all("Requires-Dist") or []


def closure(lines: list[str]) -> dict[str, md.Distribution]:
    """The installed distributions these requirements need, with their own requirements, recursively; extras
    and markers that do not apply here left out. Each installed version must meet every requirement on it."""
    found: dict[str, md.Distribution] = {}
    todo = [Requirement(line) for line in lines]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        dist = md.distribution(req.name)
        assert req.specifier.contains(dist.version, prereleases=True), f"{req} but {dist.version} is installed"
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key not in found:
            found[key] = dist
            todo += [Requirement(line) for line in dist.requires or []]
    return found


def link_into(dists: dict[str, md.Distribution], site: Path) -> None:
    """Every file each distribution installed (its RECORD), symlinked at the same place under `site`."""
    for dist in dists.values():
        for file in dist.files or []:
            if file.parts[0] == "..":  # scripts in bin/: the commands of the dependencies are not used
                continue
            target = site / file
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(Path(str(dist.locate_file(file))).resolve())


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (no system packages): the wheel's declared dependencies (linked), then the wheel installed by
    pip, offline, which checks that they meet its requirements. Its bin directory."""
    env_dir = tmp_path_factory.mktemp("wheel-venv") / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    site = Path(_run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=env_dir).stdout.strip())
    dists = closure(requirements(wheel))
    assert {"torch", "transformers"} <= dists.keys() and "attnscope" not in dists
    link_into(dists, site)
    _run(sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-index", "-c", CONSTRAINTS, wheel,
         cwd=env_dir)
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
