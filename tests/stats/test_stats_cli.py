"""attnscope stats end to end: outputs on the real UD dev set, refusal to overwrite, kill and resume."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
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
from attnscope.stats.checkpoint import FILE as CHECKPOINT


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "attnscope.cli.main", "stats", *args]


@pytest.fixture(scope="module")
def finished(ud_dev: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("stats")
    source = where / "ud <b>&.conllu"  # user-supplied text that reaches the report
    source.symlink_to(ud_dev)
    out = where / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # the terminal summary: test_the_terminal_summary_agrees_with_the_files
        assert main(["stats", str(source), "--limit", "40", "--batch-size", "16", "-o", str(out),
                     "--no-progress"]) == 0
    (where / "printed.txt").write_text(printed.getvalue(), encoding="utf-8")
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


def test_resume_with_other_metrics_or_settings_is_refused_naming_them(
        finished: Path, ud_dev: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = (finished / CHECKPOINT).read_bytes()
    args = ["stats", str(ud_dev), "--limit", "40", "--batch-size", "16", "-o", str(finished), "--resume",
            "--no-progress"]
    assert main([*args, "--norms", "--max-length", "128"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "settings.max_length 256 -> 128" in err and "+norm_cls" in err
    assert "source.spec" in err  # the fixture read the file through a symlink of another name
    assert (finished / CHECKPOINT).read_bytes() == before


def test_an_error_part_way_keeps_the_documents_before_it(ud_dev: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    lines = [f"sentence number {i} of the corpus.".encode() for i in range(100)]
    corpus, out = tmp_path / "corpus.txt", tmp_path / "out"
    corpus.write_bytes(b"\n".join([*lines[:70], b"caf\xe9", *lines[70:]]) + b"\n")
    args = [str(corpus), "-o", str(out), "--batch-size", "4", "--checkpoint-every", "1000", "--no-progress"]
    assert main(["stats", *args]) == 2
    err = capsys.readouterr().err
    assert f"{corpus}:71: not UTF-8 text" in err and "64 documents before it are checkpointed" in err
    assert json.loads((out / CHECKPOINT).read_text(encoding="utf-8"))["state"]["documents"] == 64
    corpus.write_bytes(b"\n".join([*lines[:70], b"cafe", *lines[70:]]) + b"\n")  # fixed
    assert main(["stats", *args, "--resume"]) == 0
    assert main(["stats", *args[:1], "-o", str(tmp_path / "whole"), *args[3:]]) == 0
    resumed = json.loads((out / CHECKPOINT).read_text(encoding="utf-8"))
    whole = json.loads((tmp_path / "whole" / CHECKPOINT).read_text(encoding="utf-8"))
    assert resumed["complete"] and resumed["state"] == whole["state"]


def test_the_terminal_summary_agrees_with_the_files(finished: Path) -> None:
    out = finished
    printed = (finished.parent / "printed.txt").read_text(encoding="utf-8").splitlines()
    heads = pq.read_table(out / "heads.parquet").to_pylist()
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert printed[0].startswith(f"40 documents, {summary['tokens']:,} tokens (0 truncated, 0 malformed")
    classes = {m[1]: m for m in map(re.compile(r"^  (\S+) \(.*?\)\s+(\d+): (.*)$").match, printed) if m}
    expected = {c for r in heads for c in r["classes"].split()}
    assert set(classes) == expected and expected, printed
    for name, line in classes.items():
        members = [r for r in heads if name in r["classes"].split()]
        assert int(line[2]) == len(members)
        if name != "broad":
            metric = {"previous-token": "prev", "next-token": "next", "[CLS]": "cls", "[SEP]": "sep",
                      "punctuation": "punct", "sink": "sink"}[name]
            top = max(members, key=lambda r: r[f"{metric}_mean"])
            assert line[3].startswith(f"{top['layer']}-{top['head']} {top[f'{metric}_mean']:.2f}")
    table = printed[printed.index(next(p for p in printed if p.startswith("Dependency syntax"))) + 2:][:8]
    for line, best in zip(table, summary["syntax"]["best_heads"][:8], strict=True):
        assert line.split()[:4] == [best["relation"], str(best["count"]), f"{best['layer']}-{best['head']}",
                                    f"{100 * best['accuracy']:.1f}%"]
    assert printed[-1] == f"Report: {out / 'report.html'}"


def test_ctrl_c_checkpoints_and_says_how_to_continue(ud_dev: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen(cli(str(ud_dev), "-o", str(out), "--limit", "400", "--batch-size", "4",
                                "--checkpoint-every", "5", "--no-progress"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (out / CHECKPOINT).is_file() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    checkpoint = json.loads((out / CHECKPOINT).read_text(encoding="utf-8"))
    assert proc.returncode == 130 and not checkpoint["complete"], err
    documents = checkpoint["state"]["documents"]
    assert err.strip().splitlines() == [f"attnscope: interrupted; {documents:,} documents are checkpointed in {out}: "
                                        "add --resume to the same command to continue"]


@pytest.mark.slow  # a corpus run through the CLI, ~7 s: in `make test`, not the inner loop
def test_an_empty_source_leaves_nothing_behind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus, out = tmp_path / "corpus.txt", tmp_path / "out"
    corpus.write_text("\n  \n", encoding="utf-8")
    for _ in range(2):  # the same command again: not refused as an existing run
        assert main(["stats", str(corpus), "-o", str(out), "--no-progress"]) == 2
        assert capsys.readouterr().err == f"attnscope: error: {corpus} has no documents to read\n"
    assert not any(out.iterdir())
    corpus.write_text("now a document\n", encoding="utf-8")
    assert main(["stats", str(corpus), "-o", str(out), "--no-progress"]) == 0


@pytest.mark.slow  # a corpus run through the CLI, ~7 s: in `make test`, not the inner loop
def test_an_output_that_cannot_be_written_is_one_line(ud_dev: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    args = ["stats", str(ud_dev), "--limit", "4", "-o", str(out), "--no-progress"]
    assert main(args) == 0
    for png in (out / "plots").iterdir():
        png.unlink()
    (out / "plots").rmdir()
    (out / "plots").write_text("a file where the plots go", encoding="utf-8")
    capsys.readouterr()
    assert main([*args, "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attnscope: error: {out / 'plots'}: File exists (check the path") and err.count("\n") == 1
