"""The CLI on encoder-decoder models: `attnscope check SOURCE --target TARGET --model M` and `trace ... -o FILE`.

The model is a random-weight T5 saved to a temporary checkpoint directory (tests/support/seq2seq.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import attnscope
from tests.support.cli import run

SOURCE, TARGET = "the cat sat on the mat", "die katze sass"




def test_check_prints_a_table_per_kind_and_passes(t5_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "check", SOURCE, "--target", TARGET, "--model", t5_dir)
    assert code == 0, err
    out = " ".join(out.split())  # the console wraps long lines
    assert "teacher-forced; decoder input: [PAD] [CLS] die" in out  # T5 starts the decoder with the pad token
    for label in ("encoder self-attention: 8 source tokens", "decoder self-attention (causal): 7 target tokens",
                  "cross-attention (target -> source): 7 target tokens x 8 source tokens"):
        assert label in out
    assert out.count("PASS: max error") == 3 and "position_bias" in out and "memory" in out
    assert out.rstrip().endswith("PASS: encoder PASS, decoder PASS, cross PASS")


def test_check_json_one_kind_and_a_generated_target(t5_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "check", SOURCE, "--target", TARGET, "--model", t5_dir, "--attention", "cross",
                       "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["status"] == "PASS" and list(data["kinds"]) == ["cross"]
    cross = data["kinds"]["cross"]
    assert len(cross["keys"]) == 8 and len(cross["tokens"]) == 7 and cross["max_error"] <= 1e-5
    code, out, _ = run(capsys, "check", SOURCE, "--model", t5_dir, "--max-new-tokens", "3", "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["generated"] and len(data["kinds"]["decoder"]["tokens"]) == 3


def test_trace_writes_the_three_kinds(t5_dir: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    code, out, _ = run(capsys, "trace", SOURCE, "--target", TARGET, "--model", t5_dir, "-o", str(path))
    assert code == 0 and out.startswith(f"wrote {path}") and " ".join(out.split()).count("PASS: max error") == 3
    loaded = attnscope.EncoderDecoderTrace.load(path)
    assert loaded.cross.weights.shape == (2, 4, 7, 8) and loaded.status() == "PASS"


def test_bad_input_is_one_line_and_exit_2(t5_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    cases = [
        (["check", SOURCE, "--target", TARGET], "--target is for encoder-decoder models"),  # MiniLM: an encoder
        (["check", SOURCE, "--target", " ", "--model", t5_dir], "the target (--target) is empty"),
        (["check", " ", "--target", TARGET, "--model", t5_dir], "the source is empty"),
        (["check", SOURCE + " and more" * 9, "--target", TARGET, "--model", t5_dir, "--max-length", "8",
          "--no-truncate"], "over the maximum of 8"),
        (["check", SOURCE, "--target", TARGET + " und mehr" * 9, "--model", t5_dir, "--max-length", "8",
          "--no-truncate"], "over the maximum of 8"),
        (["check", SOURCE, "--target", TARGET, "--model", t5_dir, "--attention", "self"], "invalid choice: 'self'"),
        (["check", SOURCE, "--attention", "cross"], "give --target too"),
        (["check", SOURCE, "--model", t5_dir, "--max-new-tokens", "0"], "--max-new-tokens must be"),
    ]
    for args, words in cases:
        with pytest.raises(SystemExit) if "invalid choice" in words else _no_raise() as stop:
            code, _, err = run(capsys, *args)
        if stop is not None and isinstance(stop.value, SystemExit):
            code, err = int(stop.value.code or 0), capsys.readouterr().err
        assert code == 2, (args, err)
        assert words in err and err.count("\n") == 1, (args, err)


class _no_raise:  # a stand-in for pytest.raises where the command returns
    value = None

    def __enter__(self) -> _no_raise:
        return self

    def __exit__(self, *exc: object) -> None:
        return None
