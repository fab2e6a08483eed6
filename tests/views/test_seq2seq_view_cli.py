"""`attnscope view SOURCE --target TARGET --model M` on an encoder-decoder model (a random-weight T5 saved to a
temporary checkpoint with the bundled MiniLM tokenizer): the three-kind page, a generated target, one kind's
figure, bad input in one line (exit 2), and the page size limit over the kinds together (views.size)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import attnscope
from attnscope.records.trace import EncoderDecoderTrace
from attnscope.stages import ATTENTION_LABELS
from attnscope.views import to_html
from attnscope.views.size import SCRIPT_BYTES, PageTooLarge, family_page_size, page_size
from tests.support.cli import run
from tests.support.seq2seq_traces import bart_trace

SOURCE, TARGET = "the cat sat on the mat", "die katze sass"  # 8 source tokens, 7 decoder tokens
NS = "{http://www.w3.org/2000/svg}"




def test_view_writes_the_three_kinds(t5_dir: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    page = tmp_path / "t5.html"
    code, out, err = run(capsys, "view", SOURCE, "--target", TARGET, "--model", t5_dir, "--attention", "cross",
                         "-o", str(page))
    assert code == 0, err
    assert out.startswith(f"wrote {page}: all views of 8 source -> 7 target tokens (teacher-forced)")
    html = page.read_text(encoding="utf-8")
    for label in ATTENTION_LABELS["encoder"], ATTENTION_LABELS["decoder"], "cross-attention (target -\\u003e source)":
        assert f'"attention_label": "{label}"' in html or f'"attention_label":"{label}"' in html, label
    code, out, err = run(capsys, "view", SOURCE, "--model", t5_dir, "--max-new-tokens", "3", "-o", str(page))
    assert code == 0 and "-> 3 target tokens (generated greedily)" in out, err


def test_bad_input_is_one_line_and_exit_2(t5_dir: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = str(tmp_path / "bad.html")
    cases = [
        (["--target", TARGET], "--target is for encoder-decoder models"),  # MiniLM: an encoder
        (["--attention", "cross"], "--attention is for encoder-decoder models"),
        (["--target", " ", "--model", t5_dir], "the target (--target) is empty"),
        (["--target", TARGET + " und mehr" * 9, "--model", t5_dir, "--max-length", "8", "--no-truncate"],
         "over the maximum of 8"),
        (["--pair", "a second sentence", "--model", t5_dir], "is an encoder-decoder model, so give the source"),
        (["--target", TARGET, "--model", t5_dir, "--max-mb", "0.3"], "over the --max-mb 0.3 limit"),
    ]
    for args, words in cases:
        code, _, err = run(capsys, "view", SOURCE, *args, "-o", out)
        assert code == 2 and words in err and err.count("\n") == 1, (args, err)
    code, _, err = run(capsys, "view", " ", "--target", TARGET, "--model", t5_dir, "-o", out)
    assert code == 2 and "the source is empty" in err
    assert not Path(out).exists()


def test_view_writes_a_cross_attention_figure(t5_dir: str, capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    out = tmp_path / "cross.svg"
    code, printed, err = run(capsys, "view", SOURCE, "--target", TARGET, "--model", t5_dir, "--attention", "cross",
                             "--view", "matrix", "-o", str(out))
    assert code == 0, err
    assert "figure of the matrix view of cross-attention (target -> source), 7 target x 8 source tokens" in printed
    root = ET.fromstring(out.read_bytes())
    caption = " ".join(t.text or "" for g in root.iter(f"{NS}g") if g.get("class") == "caption"
                       for t in g.iter(f"{NS}text"))
    assert ATTENTION_LABELS["cross"] in caption and "7 target × 8 source tokens" in caption


def test_page_size_is_the_sum_of_the_kinds(minilm: attnscope.Model) -> None:
    tr: EncoderDecoderTrace = bart_trace(minilm)
    size = family_page_size(tr.kinds, neuron="all")
    parts = [page_size(t, neuron="all") for t in tr.kinds.values()]
    assert size.total == sum(p.total for p in parts) - 2 * SCRIPT_BYTES  # the script once
    assert size.maps == sum(p.maps for p in parts) and size.cells == 11 * 11  # the largest map: the encoder's
    assert parts[2].cells == 8 * 11  # cross-attention: 8 target x 11 source tokens
    assert len(to_html(tr, "all", neuron="all").encode("utf-8")) <= size.total  # an upper bound of the real page
    with pytest.raises(PageTooLarge, match=r"over the max_mb=0\.3 limit: pass fewer layers= and heads="):
        to_html(tr, "all", max_mb=0.3)
