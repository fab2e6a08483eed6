"""attnscope faithfulness end to end on the real UD dev slice with MiniLM: the library and the CLI give the same
numbers, the rows agree with their own curves, SIGKILL + --resume equals an uninterrupted run, bad input is one
line and exit 2, malformed rows are counted; SmolLM2 in one test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import attnscope
from attnscope.cli.main import main
from attnscope.faithfulness import faithfulness
from attnscope.faithfulness.checkpoint import FILE as CHECKPOINT
from attnscope.faithfulness.metrics import BINS
from attnscope.records.check_report import TOLERANCE

# One torch thread everywhere: float32 sums round differently on two threads (then runs agree within 1e-7, not bit
# for bit), and it is the fast setting on a shared 2-core machine.
ARGS = ["--methods", "attention,rollout", "--max-length", "12", "--seeds", "2", "--no-progress", "--threads", "1",
        "--no-png"]  # the PNGs: test_report_page (a browser test)
KW = {"methods": "attention,rollout", "max_length": 12, "seeds": 2, "png": False}


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "attnscope.cli.main", "faithfulness", *args]


@pytest.fixture(scope="module")
def library(ud_dev: Path, minilm: attnscope.Model, tmp_path_factory: pytest.TempPathFactory,
            one_torch_thread: None) -> Path:
    out = tmp_path_factory.mktemp("faith") / "lib"
    faithfulness(ud_dev, out, minilm, limit=3, **KW)  # type: ignore[arg-type]
    return out


def test_cli_equals_the_library(library: Path, ud_dev: Path, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["faithfulness", str(ud_dev), "-o", str(tmp_path / "cli"), "--limit", "3", *ARGS]) == 0
    printed = capsys.readouterr().out
    assert "removal: delete (special tokens never removed)" in printed and "random_1" in printed
    assert (json.loads((tmp_path / "cli" / "examples.json").read_text())
            == json.loads((library / "examples.json").read_text()))
    summary = json.loads((library / "summary.json").read_text())
    assert summary["removal"] == "delete" and summary["special_tokens_removed"] is False
    assert set(summary["methods"]) == {"attention", "rollout", "leave_one_out", "random_0", "random_1", "position"}
    assert summary["unperturbed_error_max"] <= TOLERANCE
    assert pq.read_table(library / "examples.parquet").num_rows == 3 * 6


def test_rows_agree_with_their_curves_and_intervals_hold_the_mean(library: Path) -> None:
    rows = json.loads((library / "examples.json").read_text())
    for r in rows:
        dele, ins, m, full = np.array(r["deletion"]), np.array(r["insertion"]), r["removable"], r["full"]
        k50 = min(-(-50 * m // 100), m - r["min_kept"])
        assert r["comprehensiveness_50"] == pytest.approx(full - dele[k50], abs=1e-12)
        assert r["sufficiency_50"] == pytest.approx(full - ins[k50 - r["min_kept"]], abs=1e-12)
        assert r["aopc"] == pytest.approx(float(np.mean(full - dele)), abs=1e-12)
        assert 0 <= r["naopc"] <= 1 and len(r["scores"]) == m
        assert dele[0] == pytest.approx(full, abs=TOLERANCE)  # nothing removed: the model's own measure
    loo = [r for r in rows if r["method"] == "leave_one_out"]
    assert all(r["spearman_loo"] == pytest.approx(1.0, abs=1e-12) for r in loo)
    summary = json.loads((library / "summary.json").read_text())
    for entry in summary["methods"].values():
        for b in BINS:
            c = entry[f"comprehensiveness_{b}"]
            assert c["low"] <= c["mean"] <= c["high"] and c["n"] == 3


def test_resume_after_a_kill_equals_an_uninterrupted_run(library: Path, ud_dev: Path, tmp_path: Path) -> None:
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    args = [str(ud_dev), "-o", str(out), "--limit", "3", *ARGS]
    proc = subprocess.Popen(cli(*args), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if (out / CHECKPOINT).is_file() and json.loads((out / CHECKPOINT).read_text())["documents"] >= 1:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = json.loads((out / CHECKPOINT).read_text())
    assert not saved["complete"] and 1 <= saved["documents"] < 3, "the run ended before it could be killed"
    with (out / "rows.jsonl").open("ab") as handle:  # as if killed mid-append, after the last checkpoint
        handle.write(b'{"example": 9, "method": "half a row')
    resumed = subprocess.run(cli(*args, "--resume"), env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert (out / "examples.json").read_text() == (library / "examples.json").read_text()
    assert json.loads((out / CHECKPOINT).read_text())["complete"]


def _one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str], match: str) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals (an unknown choice)
        code = int(exc.code or 0)
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err and "Traceback" not in err, err


def test_bad_input_is_one_line_and_exit_2(library: Path, ud_dev: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "x")
    _one_line_exit_2(["faithfulness", str(tmp_path / "none.txt"), "-o", out], capsys, "does not exist")
    _one_line_exit_2(["faithfulness", str(ud_dev), "-o", out, "--methods", "nope"], capsys, "nope")
    _one_line_exit_2(["faithfulness", str(ud_dev), "-o", out, "--removal", "drop"], capsys, "invalid choice")
    _one_line_exit_2(["faithfulness", str(ud_dev), "-o", str(library), *ARGS], capsys, "pass --resume")
    before = (library / CHECKPOINT).read_bytes()
    _one_line_exit_2(["faithfulness", str(ud_dev), "-o", str(library), "--resume", *ARGS, "--removal", "replace"],
                     capsys, "settings.removal delete -> replace")
    assert (library / CHECKPOINT).read_bytes() == before


def test_malformed_rows_are_counted(tmp_path: Path, minilm: attnscope.Model) -> None:
    src = tmp_path / "c <b>&.jsonl"  # user-supplied text that reaches the report
    src.write_text('{"text": "The cat sat on the mat ."}\n{not json\n{"text": 3}\n{"text": "Dogs bark ."}\n')
    result = faithfulness(str(src), tmp_path / "o", minilm, methods="attention", seeds=1, png=False)
    assert result.summary["source"]["malformed"] == 2 and result.summary["examples"] == 2
    page = (tmp_path / "o" / "report.html").read_text()
    assert "c &lt;b&gt;&amp;.jsonl" in page and "<b>&" not in page and "<script" not in page
    assert page.count("<svg") == 2 and ">attention<" in page and ">position<" in page


def test_smollm2_delete_keeps_one_token_and_replace_removes_all(smollm2: attnscope.Model, tmp_path: Path) -> None:
    src = tmp_path / "t.txt"
    src.write_text("The capital of France is\n")
    for removal in ("delete", "replace"):
        rows = faithfulness(str(src), tmp_path / removal, smollm2, methods="attention", removal=removal, png=False,
                            seeds=1).rows
        r = rows[0]
        assert r["unperturbed_error"] <= TOLERANCE and r["min_kept"] == (1 if removal == "delete" else 0)
        assert len(r["deletion"]) == r["removable"] + 1 - r["min_kept"] and np.isfinite(r["deletion"]).all()
        assert r["full"] == pytest.approx(r["deletion"][0], abs=TOLERANCE * max(1.0, abs(r["full"])))


def test_metrics_agreement_gives_the_full_runs_rank_agreement_in_few_forwards(library: Path, ud_dev: Path,
                                                                              minilm: attnscope.Model,
                                                                              tmp_path: Path) -> None:
    result = faithfulness(ud_dev, tmp_path / "agree", minilm, limit=3, metrics="agreement", **KW)  # type: ignore[arg-type]
    full = json.loads((library / "examples.json").read_text())
    rows = json.loads((tmp_path / "agree" / "examples.json").read_text())  # NaN as null in both
    assert len(rows) == len(full) == len(result.rows)
    for short, long in zip(rows, full, strict=True):
        assert (short["example"], short["method"], short["scores"]) == (long["example"], long["method"], long["scores"])
        assert (short["spearman_loo"], short["kendall_loo"]) == (long["spearman_loo"], long["kendall_loo"])
        assert "naopc" not in short and "deletion" not in short and short["forwards"] == 1  # the unperturbed check
    s = result.summary
    assert s["metrics"] == "agreement" and s["naopc_bounds"] == []
    assert set(s["methods"]["attention"]) == {"examples", "spearman_loo", "kendall_loo"}
    page = (tmp_path / "agree" / "report.html").read_text()
    assert "<svg" not in page and "spearman (LOO)" in page and "no curves" in page
    assert not (tmp_path / "agree" / "deletion.svg").exists()
    with pytest.raises(attnscope.AttnscopeError, match="unknown metrics 'some'"):
        faithfulness(ud_dev, tmp_path / "bad", minilm, limit=1, metrics="some")
