"""attnscope stats end to end: outputs on the real UD dev set, refusal to overwrite, kill and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import attnscope
from attnscope.cli.main import main
from attnscope.stats import Settings, Source, run
from attnscope.stats.engine import CHECKPOINT


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "attnscope.cli.main", "stats", *args]


@pytest.fixture(scope="module")
def finished(ud_dev: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("stats")
    source = where / "ud <b>&.conllu"  # user-supplied text that reaches the report
    source.symlink_to(ud_dev)
    out = where / "run"
    assert main(["stats", str(source), "--limit", "40", "--batch-size", "16", "-o", str(out),
                 "--no-progress"]) == 0
    return out


def test_outputs_are_complete_and_consistent(finished: Path) -> None:
    heads = pq.read_table(finished / "heads.parquet").to_pylist()
    assert len(heads) == 6 * 12 and (heads[0]["layer"], heads[0]["head"]) == (0, 0)
    assert {"entropy_mean", "entropy_std", "entropy_count", "cls_mean", "classes"} <= set(heads[0])
    assert all(r["entropy_count"] == 40 for r in heads)
    csv_lines = (finished / "heads.csv").read_text(encoding="utf-8").splitlines()
    assert len(csv_lines) == 1 + 72 and csv_lines[0].startswith("layer,head,")
    summary = json.loads((finished / "summary.json").read_text(encoding="utf-8"))
    assert summary["documents"] == 40 and summary["truncated"] == 0
    assert summary["model"]["name"] == attnscope.DEFAULT_MODEL and summary["versions"]["torch"]
    syntax = pq.read_table(finished / "syntax.parquet").to_pylist()
    best = summary["syntax"]["best_heads"]
    assert best[0]["relation"] == "all"
    top = max((r for r in syntax if r["relation"] == "all"), key=lambda r: r["accuracy"])
    assert abs(top["accuracy"] - best[0]["accuracy"]) <= 1e-12
    for name in summary["metrics"]:
        assert (finished / "plots" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_is_self_contained_and_escaped(finished: Path) -> None:
    page = (finished / "report.html").read_text(encoding="utf-8")
    assert "Content-Security-Policy" in page and "<script" not in page
    assert "http://" not in page and "https://" not in page
    assert "ud <b>&" not in page and "ud &lt;b&gt;&amp;.conllu" in page
    assert page.count("data:image/png;base64,") >= 10 and "Dependency syntax" in page


def test_an_existing_output_directory_is_refused(finished: Path, ud_dev: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", str(ud_dev), "--limit", "2", "-o", str(finished), "--no-progress"]) == 2
    assert "already exists and is not empty: pass --resume" in capsys.readouterr().err


def test_resume_after_a_kill_gives_the_same_numbers(ud_dev: Path, tmp_path: Path,
                                                    minilm: attnscope.Model) -> None:
    args = ["--limit", "64", "--batch-size", "4", "--checkpoint-every", "2", "--no-progress"]
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cli(str(ud_dev), "-o", str(out), *args), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not (out / CHECKPOINT).is_file() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    checkpoint = json.loads((out / CHECKPOINT).read_text(encoding="utf-8"))
    assert not checkpoint["complete"], "the run ended before it could be killed"
    assert 0 < checkpoint["state"]["documents"] < 64
    resumed = subprocess.run(cli(str(ud_dev), "-o", str(out), "--resume", *args), env=env,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    settings = Settings(batch_size=4, limit=64, checkpoint_every=2)
    whole = run(Source(str(ud_dev)), minilm, settings, tmp_path / "whole")
    final = json.loads((out / CHECKPOINT).read_text(encoding="utf-8"))
    assert final["complete"] and final["state"] == json.loads(json.dumps(whole.state.to_dict()))
    assert (pq.read_table(out / "heads.parquet").to_pylist()
            == pq.read_table(_write(whole, minilm, tmp_path / "whole")).to_pylist())


def _write(result: object, model: attnscope.Model, out: Path) -> Path:
    from attnscope.stats.outputs import head_rows, write_table

    assert hasattr(result, "state")
    write_table(head_rows(result.state), out / "heads.parquet")
    return out / "heads.parquet"
