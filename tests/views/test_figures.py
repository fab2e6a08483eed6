"""Figures: every view as a standalone SVG (tokens as <text>, attention as <line>/<rect>), PNG and PDF, from the
page's download buttons and from `attnscope view -o fig.svg`; hostile tokens stay text."""

from __future__ import annotations

import struct
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import attnscope
from attnscope.tracing.one_pass import Trace, trace
from attnscope.views import to_html
from tests.support.cli import run

NS = "{http://www.w3.org/2000/svg}"
HOSTILE = "The cat <script>alert(1)</script> & 'dogs' sat."
ROOT = "document.getElementById('attnscope-root')"


@pytest.fixture(scope="module")
def hostile(minilm: attnscope.Model) -> Trace:
    return trace(HOSTILE, model=minilm)


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg.encode("utf-8"))
    assert root.tag == f"{NS}svg"
    assert not list(root.iter(f"{NS}script")) and not list(root.iter(f"{NS}foreignObject"))
    return root


def texts(root: ET.Element, group: str) -> list[str]:
    g = next(e for e in root.iter(f"{NS}g") if e.get("class") == group)
    return [t.text or "" for t in g.iter(f"{NS}text")]


def caption(root: ET.Element) -> str:
    """The caption's lines joined as they were written: a long line wraps at its " · " separators."""
    return " · ".join(texts(root, "caption"))


def figure_of(open_page: Callable[..., object], tr: Trace, view: str, name: str, **options: Any) -> ET.Element:
    opened = open_page(to_html(tr, view, theme="light", **options), name)  # type: ignore[operator]
    svg = opened.page.evaluate(f"() => window.attnscope.figureSVG({ROOT})")  # type: ignore[attr-defined]
    assert opened.errors == [] and opened.foreign_requests() == []  # type: ignore[attr-defined]
    return parse(svg)


def test_head_figure_tokens_are_text_and_lines_are_the_weights(open_page: Callable[..., object],
                                                                hostile: Trace) -> None:
    root = figure_of(open_page, hostile, "head", "fig-head", layer=2, show_heads=[7])
    labels = [f"{i}: {t}" for i, t in enumerate(hostile.token_strings)]
    assert texts(root, "tokens") == [x for label in labels for x in (label, label)]  # queries left, keys right
    assert {"<", ">", "&", "'"} <= {t.split(": ", 1)[1] for t in texts(root, "tokens")}  # markup stays text
    lines = [e for e in root.iter(f"{NS}line")]
    n = hostile.n_tokens
    row = float(lines[0].get("y1", "0")) * 2  # row height: the first row's centre is half a row down
    drawn = np.zeros((n, n))
    for line in lines:
        q, k = (int(float(line.get(a, "0")) // row) for a in ("y1", "y2"))
        drawn[q, k] = float(line.get("stroke-opacity", "0"))
    weights = hostile.weights[2, 7]  # [query, key]
    kept = weights >= 0.011  # lines below 0.01 (after the 8-bit code) are left out, as the caption says
    assert np.abs(drawn[kept] - weights[kept]).max() <= weights.max() / 510 + 5e-4
    assert (drawn[weights < 0.009] == 0).all()
    assert "all-MiniLM-L6-v2 · head view" in caption(root) and "layer 2 · head 7" in caption(root)
    assert "✓ verified · layer 2, head 7: max error" in caption(root)


def test_matrix_figure_has_a_cell_per_nonzero_weight(open_page: Callable[..., object], hostile: Trace) -> None:
    root = figure_of(open_page, hostile, "matrix", "fig-matrix", layer=1, head=3)
    n = hostile.n_tokens
    labels = [f"{i}: {t}" for i, t in enumerate(hostile.token_strings)]
    assert texts(root, "tokens") == [x for label in labels for x in (label, label)]  # rows, then columns
    cells = list(next(e for e in root.iter(f"{NS}g") if e.get("class") == "cells"))
    codes = np.rint(hostile.weights[1, 3] / hostile.weights[1, 3].max() * 255)  # the page's 8-bit codes
    assert 0 < len(cells) <= n * n and len(cells) >= int((codes >= 2).sum())
    assert "layer 1 · head 3" in caption(root)


@pytest.mark.parametrize(("view", "options"), [("matrix", {"layer": 0, "head": 3}),
                                             ("head", {"layer": 0, "show_heads": [3], "query": 14})])
def test_caption_has_no_empty_field(open_page: Callable[..., object], hostile: Trace, view: str,
                                    options: dict[str, Any]) -> None:
    """A self-attention page has an empty attention_label: it is left out, not shown as an empty field."""
    opened = open_page(to_html(hostile, view, theme="light", **options), f"fig-caption-{view}")  # type: ignore[operator]
    svg = opened.page.evaluate(f"() => window.attnscope.figureSVG({ROOT})")  # type: ignore[attr-defined]
    assert opened.errors == []  # type: ignore[attr-defined]
    lines = texts(parse(svg), "caption")
    assert len(lines) >= 2  # what is shown, then the badge (each wrapped at its " · " to the figure's width)
    for line in lines:
        assert "·  ·" not in line and line == line.strip(), line
        assert not line.startswith("·") and not line.endswith("·"), line
        assert all(field.strip() for field in line.split(" · ")), line
    joined = " · ".join(lines)
    assert joined.startswith(f"all-MiniLM-L6-v2 · {view} view · ") and "layer 0 · head 3" in joined
    if view == "head":  # the picked query's token is text in the caption, escaped in the SVG's source
        assert "query 14: &" in joined and "query 14: &#38;" in svg


def test_model_figure_has_a_thumbnail_per_head(open_page: Callable[..., object], hostile: Trace) -> None:
    model = figure_of(open_page, hostile, "model", "fig-model")
    thumbs = [e for e in model.iter(f"{NS}g") if e.get("class") == "thumb"]
    assert len(thumbs) == hostile.n_layers * hostile.n_heads and all(len(list(t)) > 1 for t in thumbs)


def test_the_download_button_saves_the_view_shown(open_page: Callable[..., object], hostile: Trace) -> None:
    opened = open_page(to_html(hostile, "all", layer=4, head=2), "fig-download")
    page = opened.page  # type: ignore[attr-defined]
    page.click(".as-tab[data-view=matrix]")
    with page.expect_download() as got:
        page.click(".as-export[data-format=svg]")
    download = got.value
    assert download.suggested_filename == "attnscope-matrix-layer4-head2.svg"
    root = parse(Path(download.path()).read_text(encoding="utf-8"))
    assert "matrix view" in caption(root) and "layer 4 · head 2" in caption(root)
    with page.expect_download() as got:
        page.click(".as-export[data-format=png]")
    png = Path(got.value.path()).read_bytes()
    width = struct.unpack(">I", png[16:20])[0]
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and width == 2 * int(root.get("width", "0"))  # 2x the SVG




def test_cli_writes_svg_png_and_pdf(capsys: pytest.CaptureFixture[str], minilm: attnscope.Model,
                                    tmp_path: Path) -> None:
    svg, png, pdf = tmp_path / "fig.svg", tmp_path / "fig.png", tmp_path / "fig.pdf"
    code, printed, _ = run(capsys, "view", HOSTILE, "--view", "head", "--layer", "2", "--head", "7", "-o", str(svg))
    assert code == 0 and printed.startswith(f"wrote {svg}: figure of the head view of")
    root = parse(svg.read_text(encoding="utf-8"))
    assert "<script>" not in svg.read_text(encoding="utf-8") and "layer 2 · head 7" in caption(root)
    code, _, _ = run(capsys, "view", HOSTILE, "--view", "matrix", "--scale", "3", "-o", str(png))
    head = png.read_bytes()[:24]
    assert code == 0 and head[:8] == b"\x89PNG\r\n\x1a\n"
    code, _, _ = run(capsys, "view", HOSTILE, "--view", "matrix", "-o", str(svg))
    assert struct.unpack(">I", head[16:20])[0] == 3 * int(parse(svg.read_text(encoding="utf-8")).get("width", "0"))
    code, _, _ = run(capsys, "view", HOSTILE, "--view", "model", "-o", str(pdf))
    assert code == 0 and pdf.read_bytes()[:5] == b"%PDF-"


@pytest.mark.parametrize(("args", "message"), [
    (["-o", "fig.gif"], "unsupported output format 'gif': name the output FILE.html, FILE.svg, FILE.png or FILE.pdf"),
    (["--format", "svg", "-o", "fig.png"], "--format svg writes a SVG: name the output FILE.svg, not 'fig.png'"),
    (["--view", "all", "-o", "fig.svg"], "a svg figure shows one view: add --view head, model, matrix or neuron"),
    (["--view", "head", "--scale", "0", "-o", "fig.png"], "scale must be above 0 and at most 8, got 0"),
    (["--view", "head", "--scale", "2", "-o", "fig.svg"], "--scale sizes a png figure: name the output FILE.png"),
])
def test_bad_figure_options_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch, args: list[str],
                                                    message: str) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "view", "time flies", *args)
    assert code == 2 and out == "" and err.startswith(f"attnscope: error: {message}") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_effect_grid_figure_has_every_value_and_nan_as_nan(open_page: Callable[..., object], hostile: Trace) -> None:
    from attnscope.views.effects import grids_html

    grid = hostile.weights[:, :, :, 0].mean(axis=-1) - 0.5  # [layer, head]: mean attention to [CLS], centred
    grid[1, 2] = np.nan
    opened = open_page(grids_html("first-token attention", hostile.model["name"], "test", {"cls": grid},
                                  {"cls": "attention to token 0 - 0.5"}, hostile), "fig-effects")
    page = opened.page  # type: ignore[attr-defined]
    with page.expect_download() as got:
        page.click("#attnscope-effects-root .as-export[data-format=svg]")
    root = parse(Path(got.value.path()).read_text(encoding="utf-8"))
    shown = texts(root, "grid")[1 + grid.shape[1]:]  # after the title and the head labels: layer labels and cells
    values = [c for c in shown if not c.startswith("layer ")]
    expected = ["NaN" if np.isnan(v) else f"{v:+.4f}" for v in grid.ravel()]
    assert values == expected and "first-token attention" in caption(root)
