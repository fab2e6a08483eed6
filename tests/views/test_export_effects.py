"""Figures of the effect grids from the CLI: `attnscope ablate TEXT --each --html fig.svg` writes the grid as the
page's SVG (a cell per layer and head with its value as text); an unsupported suffix is one line, exit 2."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

import attnscope
from attnscope.cli.main import main

NS = "{http://www.w3.org/2000/svg}"


def shown(v: float | None) -> str:
    """A value as the page writes it (assets/effects.js): signed, 4 decimals (1 from 100), NaN as NaN."""
    return "NaN" if v is None else f"{v:+.{1 if abs(v) >= 100 else 4}f}"


def test_ablate_each_grid_as_svg(tiny_model: Callable[[str], attnscope.Model], tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    tiny = tiny_model("bert")  # random weights, 2 layers x 4 heads: a small grid, quickly
    tiny.model.save_pretrained(tmp_path / "bert")
    tiny.tokenizer.save_pretrained(tmp_path / "bert")
    svg = tmp_path / "grid.svg"
    code = main(["ablate", "The cat sat on the mat.", "--model", str(tmp_path / "bert"), "--each", "--format", "json",
                 "--html", str(svg)])
    out, err = capsys.readouterr()
    assert code == 0 and f"wrote {svg}" in err
    data = json.loads(out)
    primary = data["grid"][data["primary"]]  # [layer, head]
    root = ET.fromstring(svg.read_bytes())
    grid = next(g for g in root.iter(f"{NS}g") if g.get("class") == "grid" and g.get("data-name") == data["primary"])
    cells = [t.text for t in grid.iter(f"{NS}text") if t.get("text-anchor") == "middle" and t.get("font-size")]
    assert len(primary) == 2 and len(primary[0]) == 4
    assert cells == [shown(v) for row in primary for v in row]  # every layer x head value, in order
    caption = " ".join(t.text or "" for g in root.iter(f"{NS}g") if g.get("class") == "caption" for t in g)
    assert "ablation of each head alone" in caption and "0-indexed" in caption


def test_unsupported_grid_format_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["ablate", "time flies", "--each", "--html", str(tmp_path / "grid.gif")])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("attnscope: error: unsupported --html format 'gif': name it FILE.html (the heatmap page), "
                          "or FILE.svg, FILE.png or FILE.pdf (a figure)")
    assert list(tmp_path.iterdir()) == []
