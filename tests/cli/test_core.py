"""The command line, run as a user runs it: exit codes, formats, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import attnscope
from attnscope.cli.main import main
from tests.support.cli import run


def test_explain_text(capsys: pytest.CaptureFixture[str], minilm: attnscope.Model) -> None:
    code, out, _ = run(capsys, "explain", "time flies like an arrow", "--layer", "1", "--head", "3")
    assert code == 0
    assert "layer 1, head 3" in out and "Softmax" in out and "check: OK" in out


def test_explain_json_has_every_stage(capsys: pytest.CaptureFixture[str], minilm: attnscope.Model) -> None:
    code, out, _ = run(capsys, "explain", "hello there", "--format", "json", "--token", "1")
    data = json.loads(out)
    assert code == 0 and data["token"] == 1
    assert {s["stage"] for s in data["steps"]} >= {"x", "q", "k", "v", "scores", "scaled", "masked", "weights",
                                                   "context", "merged", "output"}


def test_check_passes_and_prints_a_table(capsys: pytest.CaptureFixture[str], minilm: attnscope.Model) -> None:
    code, out, _ = run(capsys, "check", "time flies like an arrow", "--pair", "fruit flies like a banana")
    assert code == 0 and "PASS: max error" in out and "13 tokens, 6 layers x 12 heads" in out
    assert "over 9 stage comparisons x 6 layers x 12 heads" in out and "(rel): scores are compared relative" in out
    code, out, _ = run(capsys, "check", "time flies", "--format", "markdown")
    assert code == 0 and out.startswith("**all-MiniLM-L6-v2 (BertModel): 4 tokens, 6 layers x 12 heads**")
    code, out, _ = run(capsys, "check", "time flies", "--format", "json")
    assert code == 0 and json.loads(out)["ok"] is True


def test_trace_writes_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, minilm: attnscope.Model) -> None:
    path = tmp_path / "t.safetensors"
    code, out, _ = run(capsys, "trace", "time flies", "-o", str(path))
    assert code == 0 and path.exists() and "PASS" in out
    assert attnscope.Trace.load(path).token_strings == ["[CLS]", "time", "flies", "[SEP]"]


def test_text_file_and_markdown(capsys: pytest.CaptureFixture[str], tmp_path: Path, minilm: attnscope.Model) -> None:
    f = tmp_path / "in.txt"
    f.write_text("北京大学\n", encoding="utf-8")
    code, out, _ = run(capsys, "explain", "--text-file", str(f), "--format", "markdown")
    assert code == 0 and "| 1:北 |" in out


def test_toy(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "toy", "--no-scale", "--format", "json")
    steps = {s["stage"]: s["arrays"] for s in json.loads(out)["steps"]}
    assert code == 0 and steps["scores"]["scores"] == [[2, 4, 4], [4, 16, 12], [4, 12, 10]]
    code, out, _ = run(capsys, "toy", "--causal", "--format", "json")
    steps = {s["number"]: s["arrays"] for s in json.loads(out)["steps"]}
    assert code == 0 and steps["4c"]["mask"][0] == [0.0, None, None]  # strict JSON: -inf (masked) is null


@pytest.mark.parametrize("args, message", [
    (["explain", ""], "the text is empty"),
    (["explain", "hi", "--layer", "6"], "layer 6 is out of range"),
    (["explain", "hi", "--head", "12"], "valid values are 0..11"),
    (["explain", "hi", "--token", "3"], "token 3 is out of range: this text has 3 tokens"),
    (["explain", "word " * 20, "--max-length", "8", "--no-truncate"], "over the maximum of 8"),
    (["explain", "--text-file", "/nonexistent/file.txt"], "no such file"),
    (["check", "hi", "--model", "no-such-org/no-such-model"], "not available offline"),
    (["explain"], "no text given"),
    (["trace", "hi", "-o", "/nonexistent/dir/t.safetensors"], "/nonexistent/dir is not a directory"),
    (["trace", "hi", "-o", "/proc/t.safetensors"], "cannot write /proc/t.safetensors"),
    (["view", "hi", "-o", "/nonexistent/dir/v.html"], "cannot write /nonexistent/dir/v.html"),
    (["stats", "/nonexistent/c.txt", "-o", "/tmp/x"], "source /nonexistent/c.txt does not exist"),
    (["stats", "/proc/version", "-o", "/proc/attnscope-out"], "cannot create the output directory"),
])
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code, _, err = run(capsys, *args)
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err


def test_truncation_warns(capsys: pytest.CaptureFixture[str], minilm: attnscope.Model) -> None:
    code, _, err = run(capsys, "check", "word " * 20, "--max-length", "8")
    assert code == 0 and "keeping the first 8" in err


def test_non_utf8_file_as_a_real_process(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("café".encode("latin-1"))
    out = subprocess.run([sys.executable, "-m", "attnscope.cli.main", "explain", "--text-file", str(bad)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip() == f"attnscope: error: cannot read {bad}: it is not UTF-8 " \
                                                          "text (re-save it as UTF-8)"


def test_unknown_option_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["explain", "hi", "--layre", "1"])
    assert exc.value.code == 2
