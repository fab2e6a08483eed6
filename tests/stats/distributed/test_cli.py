"""attnscope stats --engine ray: the same files as the local engine, and one-line refusals."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from attnscope.cli.main import main

ARGS = ("--limit", "40", "--batch-size", "16", "--no-progress")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys\nfrom attnscope.cli.main import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.run([sys.executable, "-c", code, "stats", *args], capture_output=True, text=True,
                          timeout=300)


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def test_without_ray_the_message_says_how_to_install_it(ud_dev: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the ray extra were not installed
    assert main(["stats", str(ud_dev), "--engine", "ray", "-o", str(tmp_path / "out"), *ARGS]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "attnscope: error: --engine ray needs Ray, which is not installed: pip install 'attnscope[ray]'"]
    assert not (tmp_path / "out").exists()


def test_cluster_options_without_the_ray_engine_are_refused(ud_dev: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", str(ud_dev), "--workers", "2", "-o", str(tmp_path / "out"), *ARGS]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "add --engine ray" in err[0]


@pytest.mark.usefixtures("ray_runtime")
def test_ray_engine_writes_the_local_engine_files(ud_dev: Path, tmp_path: Path) -> None:
    """A fresh process starts its own local Ray runtime, runs 2 workers and shuts Ray down again.
    With --norms: the workers, processes of their own, compute the norm columns too."""
    assert main(["stats", str(ud_dev), "-o", str(tmp_path / "local"), "--norms", *ARGS]) == 0
    done = cli(str(ud_dev), "--engine", "ray", "--workers", "2", "-o", str(tmp_path / "ray"), "--format", "json",
               "--norms", *ARGS)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)  # nothing but the report on stdout
    assert report["documents"] == 40
    on_ray = rows(tmp_path / "ray" / "heads.csv")
    assert on_ray == rows(tmp_path / "local" / "heads.csv")
    assert {r["norm_cls_count"] for r in on_ray} == {"40"} and {r["other_count"] for r in on_ray} == {"40"}
    local = json.loads((tmp_path / "local" / "summary.json").read_text(encoding="utf-8"))
    on_ray = json.loads((tmp_path / "ray" / "summary.json").read_text(encoding="utf-8"))
    for key in ("documents", "tokens", "truncated", "model"):
        assert on_ray[key] == local[key]
