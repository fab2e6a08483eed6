"""The views in a real Jupyter kernel, then drawn by Chromium the way a notebook front end shows outputs."""

from __future__ import annotations

import html
import re
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from attnscope.views.browser import READY
from tests.support.views import ARTIFACTS

CELLS = [
    'import attnscope\ntr = attnscope.trace("time flies like an arrow")\ntr',
    'tr.show("neuron", layer=2, head=4)',
    "import torch\nfrom attnscope.bertviz import head_view\n"
    "head_view([torch.full((1, 2, 3, 3), 1 / 3)], ['a', '</script><b>b</b>', 'c'])",
]


@pytest.fixture(scope="module")
def outputs() -> list[str]:
    """The text/html each cell produced, from a notebook run by a real IPython kernel."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    htmls = []
    for cell in nb.cells:
        shown = [o for o in cell.outputs if o.output_type in ("execute_result", "display_data")]
        assert len(shown) == 1, cell.outputs  # shown once: show() displays and returns None
        htmls.append(shown[0].data["text/html"])
    return htmls


def test_each_cell_shows_one_sandboxed_frame(outputs: list[str]) -> None:
    for out in outputs:
        assert re.fullmatch(r'<div class="attnscope-frame" [^>]*><iframe sandbox="allow-scripts" srcdoc="[^"]*" '
                            r'[^>]*></iframe></div>', out)
    inner = [html.unescape(re.search(r'srcdoc="([^"]*)"', o).group(1)) for o in outputs]  # type: ignore[union-attr]
    assert '"view":"all"' in inner[0] and '"view":"neuron"' in inner[1] and '"view":"head"' in inner[2]


def test_frames_draw_isolated_from_the_notebook(outputs: list[str], browser: Any,
                                                tmp_path_factory: pytest.TempPathFactory) -> None:
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    host = tmp_path_factory.mktemp("notebook") / "notebook.html"
    host.write_text("<!doctype html><meta charset=utf-8><body>" + "\n".join(outputs), encoding="utf-8")
    page.goto(host.as_uri())
    frames = [f for f in page.frames if f != page.main_frame]
    assert len(frames) == 3
    for frame in frames:
        frame.wait_for_selector(READY, state="attached", timeout=60_000)
        assert frame.evaluate("() => { try { return parent.document && 'open'; } catch (e) { return 'isolated'; } }") \
            == "isolated"
    assert frames[1].input_value('select[aria-label="layer (0-indexed)"]') == "2"
    assert frames[2].eval_on_selector_all(".as-q .as-tok", "ts => ts.map(t => t.textContent)") == [
        "a", "</script><b>b</b>", "c"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "notebook.png"), full_page=True)
    assert errors == []
