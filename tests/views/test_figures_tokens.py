"""Tokens shown as text: a byte-level tokenizer's pieces ("Ġworld", "Ċ") read as the tokenizer decodes each of them
(" world", a newline) in pages and figures; the marks only when asked (`raw_tokens`, `--raw-tokens`); a trace saved
before tokens carried their decoding still loads and shows its pieces."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import attnscope
from attnscope.records.trace import load_trace, save_trace
from attnscope.tracing.one_pass import Trace, trace
from attnscope.views import to_html
from tests.support.cli import run
from tests.support.views import page_payload

NS = "{http://www.w3.org/2000/svg}"
TEXT = "Hello world,\nnaïve cats"


@pytest.fixture(scope="module")
def smol(smollm2: attnscope.Model) -> Trace:
    return trace(TEXT, model=smollm2)


def one_line(s: str) -> str:
    """As the views' labels show a token (A.oneLine): a newline, tab or carriage return as a visible mark."""
    return s.replace("\r\n", "↵").replace("\n", "↵").replace("\t", "⇥").replace("\r", "␍")


def labels(svg: str) -> list[str]:
    root = ET.fromstring(svg.encode("utf-8"))
    g = next(e for e in root.iter(f"{NS}g") if e.get("class") == "tokens")
    return [t.text or "" for t in g.iter(f"{NS}text")]


def test_tokens_carry_the_tokenizers_decoding(smol: Trace, smollm2: attnscope.Model,
                                              minilm: attnscope.Model) -> None:
    pieces = smol.token_strings
    assert any(p.startswith("Ġ") for p in pieces) and any("Ċ" in p for p in pieces)  # the marks are in the pieces
    decoded = [smollm2.tokenizer.convert_tokens_to_string([p]) for p in pieces]
    assert [t.decoded for t in smol.tokens] == decoded and [t.shown for t in smol.tokens] == decoded
    assert " world" in decoded and any("\n" in d for d in decoded)
    bert = trace("embeddings tokenize", model=minilm)  # WordPiece: its own decoding keeps "##"
    assert [t.shown for t in bert.tokens] == bert.token_strings and "##s" in bert.token_strings


def test_pages_show_tokens_as_they_read_and_marks_on_request(smol: Trace) -> None:
    shown = page_payload(to_html(smol, "head"))
    assert shown["tokens"] == [t.shown for t in smol.tokens] and not any("Ġ" in t for t in shown["tokens"])
    raw = page_payload(to_html(smol, "head", raw_tokens=True))
    assert raw["tokens"] == smol.token_strings and raw["raw_tokens"] is True


def test_figures_show_tokens_as_they_read_and_marks_on_request(capsys: pytest.CaptureFixture[str], smol: Trace,
                                                                tmp_path: Path) -> None:
    fig, raw = tmp_path / "fig.svg", tmp_path / "raw.svg"
    assert run(capsys, "view", TEXT, "--model", "smollm2", "--view", "head", "--layer", "1", "-o", str(fig))[0] == 0
    expected = [f"{i}: {one_line(t.shown)}" for i, t in enumerate(smol.tokens)]
    assert labels(fig.read_text(encoding="utf-8")) == [x for label in expected for x in (label, label)]
    assert "Ġ" not in fig.read_text(encoding="utf-8") and "Ċ" not in fig.read_text(encoding="utf-8")
    assert "↵" in fig.read_text(encoding="utf-8")  # the newline is seen, not lost in a label
    assert run(capsys, "view", TEXT, "--model", "smollm2", "--view", "head", "--layer", "1", "--raw-tokens",
               "-o", str(raw))[0] == 0
    marked = [f"{i}: {p}" for i, p in enumerate(smol.token_strings)]
    assert labels(raw.read_text(encoding="utf-8")) == [x for label in marked for x in (label, label)]


def test_a_trace_saved_without_decodings_still_loads(smol: Trace, tmp_path: Path) -> None:
    from attnscope.records import files

    path = tmp_path / "old.safetensors"
    save_trace(smol, path)
    arrays, meta = files.read(path)
    for t in meta["tokens"]:  # as a trace saved before tokens carried their decoding
        del t["decoded"]
    files.write(path, arrays, meta, {"tokens": smol.token_strings})
    old = load_trace(path)
    assert [t.decoded for t in old.tokens] == [None] * smol.n_tokens
    assert page_payload(to_html(old, "head"))["tokens"] == smol.token_strings  # its pieces, as they were shown
    assert [t.shown for t in load_trace(path).tokens] == smol.token_strings


def test_the_generation_figure_shows_tokens_as_they_read(smollm2: attnscope.Model, tmp_path: Path) -> None:
    from attnscope.tracing.decoding import generate
    from attnscope.views.generation import generation_figure

    g = generate("The capital of France is", model=smollm2, max_new_tokens=3)
    read = labels_of(generation_figure(g, tmp_path / "g.svg", step=2, layer=1).read_text(encoding="utf-8"))
    shown = [t.shown for t in g.prompt_tokens] + [s.piece or s.text for s in g.steps]
    assert read == [t.replace("\n", "↵") for t in shown]  # a newline drawn as ↵
    assert not any("Ġ" in t for t in read) and " capital" in read
    raw = labels_of(generation_figure(g, tmp_path / "r.svg", step=2, layer=1, raw_tokens=True).read_text("utf-8"))
    assert raw == [t.text for t in g.tokens] and "Ġcapital" in raw


def labels_of(svg: str) -> list[str]:
    """The generation figure's tokens: one <text> each, whitespace kept (xml:space="preserve")."""
    root = ET.fromstring(svg.encode("utf-8"))
    g = next(e for e in root.iter(f"{NS}g") if e.get("class") == "tokens")
    return [t.text or "" for t in g.iter(f"{NS}text")]
