"""The faithfulness report page (torch-free): its style is the one stats' page uses (views.report_style), its
values are escaped, nothing on it can be fetched; the curves as SVG and as PNG (headless Chromium)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from attnscope.errors import AttnscopeError
from attnscope.faithfulness.report_page import curve_svg, report_html, write_report
from attnscope.views.raster import svg_size, svgs_to_png
from attnscope.views.report_style import CSP, CSS


def _summary(name: str = "attention") -> dict[str, Any]:
    band = {"x": [0.0, 0.5, 1.0], "mean": [1.0, 0.5, 0.2], "low": [0.9, 0.4, 0.1], "high": [1.1, 0.6, 0.3]}
    metric = {"mean": 0.5, "low": 0.4, "high": 0.6, "n": 3, "nan": 0}
    scalars = ["naopc", "aopc", "comprehensiveness_aopc", "sufficiency_aopc", "deletion_area", "insertion_area",
               "spearman_loo", "kendall_loo", *(f"{w}_{b}" for w in ("comprehensiveness", "sufficiency")
                                                 for b in (1, 5, 10, 20, 50))]
    return {"model": "m<b>", "source": {"spec": "a&b.txt", "malformed": 0}, "examples": 3, "skipped": 0,
            "removal": "delete", "unperturbed_error_max": 0.0, "naopc_bounds": ["exact"],
            "methods": {name: {"examples": 3, "deletion": band, "insertion": band, **{s: metric for s in scalars}}},
            "agreement": {"methods": [name], "matrix": [[1.0]]}}


def test_both_report_pages_share_one_style() -> None:
    page = report_html(_summary())
    assert f"<style>{CSS}</style>" in page and f'content="{CSP}"' in page
    assert "default-src 'none'" in CSP and "<script" not in page
    from attnscope.stats.report_page import report_html as stats_html  # imports torch: last

    info = {"model": {"name": "m", "architecture": "bert", "layers": 1, "heads": 1}, "source": {"spec": "s"},
            "documents": 1, "tokens": 2, "truncated": 0, "indexing": "0-indexed", "metrics": {}, "thresholds": {}}
    stats_page = stats_html(info, [], {})
    assert CSS in stats_page and f'content="{CSP}"' in stats_page


def test_values_are_escaped() -> None:
    page = report_html(_summary("<img src=x>"))
    assert "<img src=x>" not in page and "&lt;img src=x&gt;" in page and "m&lt;b&gt;" in page


def test_the_curves_are_written_as_png_of_the_svgs_size_and_not_blank(tmp_path: Path) -> None:
    """Chromium draws each SVG at 2 pixels per SVG pixel: the PNG's size is the SVG's times 2, it is not one
    colour, and the method's line colour is in it (the drawing, not only the page's white)."""
    from PIL import Image

    summary = _summary()
    files = write_report(summary, tmp_path)
    assert [f.name for f in files] == ["report.html", "deletion.svg", "insertion.svg", "deletion.png",
                                       "insertion.png"]
    for which in ("deletion", "insertion"):
        width, height = svg_size(curve_svg(summary, which))
        with Image.open(tmp_path / f"{which}.png") as im:
            assert im.format == "PNG" and im.size == (2 * width, 2 * height)
            colours = {c for _, c in im.convert("RGB").getcolors(1 << 20) or []}
        assert len(colours) > 50 and (255, 255, 255) in colours
        assert (0x1F, 0x77, 0xB4) in colours  # the first method's line colour, #1f77b4


def test_without_png_only_the_svgs_are_written(tmp_path: Path) -> None:
    files = write_report(_summary(), tmp_path, png=False)
    assert [f.name for f in files] == ["report.html", "deletion.svg", "insertion.svg"]
    assert not list(tmp_path.glob("*.png"))


def test_an_svg_without_a_size_is_refused_before_a_browser_starts(tmp_path: Path) -> None:
    with pytest.raises(AttnscopeError, match="without width and height"):
        svgs_to_png([("<svg></svg>", tmp_path / "x.png")])
