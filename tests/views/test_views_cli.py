"""`attnscope view` as a user runs it: the file it writes, its options, its one-line errors."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import attnscope
from attnscope.tracing.one_pass import trace
from tests.support.cli import run
from tests.support.views import decode_source, page_payload


def test_view_writes_one_self_contained_page(capsys: pytest.CaptureFixture[str], minilm: attnscope.Model,
                                              tmp_path: Path) -> None:
    out = tmp_path / "v.html"
    code, printed, _ = run(capsys, "view", "time flies like an arrow", "--pair", "fruit flies", "-o", str(out))
    assert code == 0 and printed.startswith(f"wrote {out}: all views of 10 tokens, 6 layers x 12 heads")
    data = page_payload(out.read_text(encoding="utf-8"))
    expected = trace("time flies like an arrow", "fruit flies", model=minilm)
    assert data["tokens"] == expected.token_strings and data["pair"] == "fruit flies"
    assert np.abs(decode_source(data["sources"][0]) - expected.weights).max() <= expected.weights.max() / 510 + 1e-6


def test_view_options_reach_the_page(capsys: pytest.CaptureFixture[str], minilm: attnscope.Model,
                                     tmp_path: Path) -> None:
    out = tmp_path / "m.html"
    code, _, _ = run(capsys, "view", "time flies", "--view", "matrix", "--layers", "0,2", "5", "--heads", "3", "1",
                     "--layer", "2", "--head", "3", "--token", "1", "--theme", "dark", "--neuron", "none",
                     "-o", str(out))
    data = page_payload(out.read_text(encoding="utf-8"))
    assert code == 0 and data["layers"] == [0, 2, 5] and data["heads"] == [1, 3]
    assert data["initial"] | {"heads": None} == {"view": "matrix", "layer": 2, "head": 3, "heads": None, "query": 1,
                                                 "source": None, "theme": "dark"}
    assert data["neuron"]["blocks"] == []


@pytest.mark.parametrize(("args", "message"), [
    (["--layers", "one"], "--layers takes whole numbers (0-indexed), got 'one'"),
    (["--layer", "7"], "layer 7 is not in this view: it shows layers [0, 1, 2, 3, 4, 5] (0-indexed)"),
    (["--heads", "12"], "head 12 is out of range: this model has 12 heads, valid values are 0..11 (0-indexed)"),
    (["--token", "40"], "token 40 is out of range: this text has 4 tokens"),
    (["--format", "png"], "--format png writes a PNG: name the output FILE.png, not 'v.html'"),
])
def test_bad_options_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], minilm: attnscope.Model,
                                            tmp_path: Path, args: list[str], message: str) -> None:
    code, out, err = run(capsys, "view", "time flies", *args, "-o", str(tmp_path / "v.html"))
    assert code == 2 and out == "" and err.startswith(f"attnscope: error: {message}") and err.count("\n") == 1
    assert not (tmp_path / "v.html").exists()


def test_png_is_a_picture_of_the_page(capsys: pytest.CaptureFixture[str], minilm: attnscope.Model,
                                      tmp_path: Path) -> None:
    out = tmp_path / "v.png"
    code, printed, _ = run(capsys, "view", "time flies like an arrow", "--view", "model", "--width", "900",
                           "-o", str(out))
    head = out.read_bytes()[:24]
    assert code == 0 and "model view of 7 tokens" in printed and printed.rstrip().endswith("png)")
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    width, height = struct.unpack(">II", head[16:24])
    assert width == 900 and height >= 500  # the whole 6 x 12 grid, not an empty page
