"""`attnscope attribute`: the three formats, the checks beside the scores, exit codes, one-line refusals."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

import attnscope
from tests.support.cli import run, saved


@pytest.fixture(scope="module")
def gpt2_dir(tiny_lm: Callable[[str], attnscope.Model], tmp_path_factory: pytest.TempPathFactory) -> str:
    return saved(tiny_lm("gpt2"), tmp_path_factory, "gpt2")


def test_json_minilm(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "attribute", "time flies like an arrow", "--methods",
                         "rollout,integrated_gradients,leave_one_out", "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["status"] == "PASS" and data["kind"] == "encoder"
    assert [t["text"] for t in data["tokens"]] == ["[CLS]", "time", "flies", "like", "an", "arrow", "[SEP]"]
    ig = data["methods"]["integrated_gradients"]
    assert ig["check"]["name"] == "completeness" and ig["check"]["value"] <= 0.01 and ig["settings"]["steps"]
    assert len(ig["scores"]) == 1 and len(ig["scores"][0]) == 7


def test_text_and_markdown(capsys: pytest.CaptureFixture[str], gpt2_dir: str, tmp_path: Path) -> None:
    code, out, _ = run(capsys, "attribute", "the capital of france is", "--model", gpt2_dir, "--methods",
                       "attention,saliency,leave_one_out", "--target", "paris")
    out = " ".join(out.split())  # rich wraps to the terminal
    assert code == 0 and "log p('paris' | 'the capital of france is')" in out
    assert "PASS finite difference" in out and "PASS unperturbed forward" in out and "PASS: 3 methods" in out
    path = tmp_path / "a.md"
    code, out, _ = run(capsys, "attribute", "the capital of france is", "--model", gpt2_dir, "--methods",
                       "leave_one_out", "--format", "markdown", "-o", str(path))
    text = path.read_text()
    assert code == 0 and out == "" and "| method |" in text and "| leave_one_out |" in text


def test_raw_tokens_prints_the_pieces_as_spelled(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    shown, raw = tmp_path / "shown.md", tmp_path / "raw.md"  # SmolLM2's byte-level pieces: "Ġcapital" reads " capital"
    for path, extra in ((shown, []), (raw, ["--raw-tokens"])):
        code, _, _ = run(capsys, "attribute", "The capital of France is", "--model", "smollm2", "--methods",
                         "attention", "--target", " Paris", "--format", "markdown", "-o", str(path), *extra)
        assert code == 0
    assert "`1:Ġcapital`" in raw.read_text() and "Ġ" not in shown.read_text()
    assert "`1: capital`" in shown.read_text()


def test_a_failed_check_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "attribute", "time flies like an arrow", "--methods", "integrated_gradients",
                       "--ig-steps", "2", "--ig-max-steps", "2")
    out = " ".join(out.split())
    assert code == 1 and "FAIL completeness" in out and "raise ig_max_steps" in out


@pytest.mark.parametrize(("args", "message"), [
    (["--methods", "saliency,ig"], "unknown attribution method 'ig'"),
    (["--methods", "saliency"], "saliency does not apply to all-MiniLM-L6-v2 (BertModel)"),
    (["--target", " Paris"], "not a predicted token, so it takes no --target"),
    (["--ig-steps", "64", "--ig-max-steps", "32"], "--ig-steps 64 is more than the step cap, 32: give --ig-steps at "
                                                   "most 32, or raise the cap"),
    (["--methods", "flow", "--max-flow-tokens", "3"], "beyond its budget of --max-flow-tokens 3 tokens"),
    (["--methods", "leave_one_out", "--max-perturb-tokens", "3"], "raise --max-perturb-tokens"),
])
def test_bad_input_one_line_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code, out, err = run(capsys, "attribute", "time flies like an arrow", *args)
    assert code == 2 and out == "" and message in err and err.count("\n") == 1, err


def test_target_that_tokenizes_to_nothing(capsys: pytest.CaptureFixture[str], gpt2_dir: str) -> None:
    code, _, err = run(capsys, "attribute", "the capital of france is", "--model", gpt2_dir, "--target", "   ")
    assert code == 2 and "tokenizes to nothing" in err and err.count("\n") == 1
