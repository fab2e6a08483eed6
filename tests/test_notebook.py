"""The learner's notebook runs top to bottom against the real model, so it never rots."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "self_attention_from_scratch.ipynb"


def test_notebook_executes_and_its_checks_pass(tmp_path: Path) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "attnscope's toy example matches the hand computation" in outputs
    assert "ok: True" in outputs
    assert "Error" not in outputs
