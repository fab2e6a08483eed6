"""Run the learner's notebook in place (outputs stored) and render it into docs/ as Markdown.

    .venv/bin/python examples/notebook.py            # execute, store the outputs, write the Markdown
    .venv/bin/python examples/notebook.py --render   # only re-render the stored notebook

tests/packaging/test_notebook.py executes a copy and checks that the stored outputs and docs/ are current.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "self_attention_from_scratch.ipynb"
RENDERED = ROOT / "docs" / "self_attention_from_scratch.md"
TIMEOUT_S = 600


def execute(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Run every cell in a fresh python3 kernel, in a scratch directory; the outputs land in `nb`."""
    with tempfile.TemporaryDirectory(prefix="attnscope-nb-") as tmp:
        NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": tmp}}).execute()
    return nb


def _outputs(cell: nbformat.NotebookNode) -> list[str]:
    text = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            text.append(out["text"])
        elif "data" in out and "text/plain" in out["data"]:
            text.append(out["data"]["text/plain"])
        elif out.get("output_type") == "error":
            text.append(f"{out['ename']}: {out['evalue']}")
    return text


def render(nb: nbformat.NotebookNode) -> str:
    """Markdown cells as they are, code in ```python blocks, each cell's printed output in a ```text block."""
    parts = [f"<!-- rendered from examples/{NOTEBOOK.name} by examples/notebook.py: do not edit -->"]
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            parts.append(cell.source)
        elif cell.cell_type == "code":
            parts.append(f"```python\n{cell.source}\n```")
            out = "".join(_outputs(cell)).rstrip("\n")
            if out:
                parts.append(f"```text\n{out}\n```")
    return "\n\n".join(parts) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render", action="store_true", help="only render the stored notebook into docs/")
    args = parser.parse_args()
    nb = nbformat.read(NOTEBOOK, as_version=4)
    if not args.render:
        nb = execute(nb)
        nbformat.write(nb, NOTEBOOK)
    RENDERED.write_text(render(nb), encoding="utf-8")


if __name__ == "__main__":
    main()
