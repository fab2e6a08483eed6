"""The learner's notebook runs top to bottom against the real model, quietly, and what is stored is current:
outputs kept in the .ipynb, and docs/ rendered from exactly those outputs (examples/notebook.py makes both)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import nbformat
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOISE = re.compile(r"Warning|Loading weights|it/s\]|Traceback|Error")  # warnings, loading bars, failures


@pytest.fixture(scope="module")
def runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("notebook_runner", EXAMPLES / "notebook.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def printed(nb: nbformat.NotebookNode, runner: ModuleType) -> str:
    return "".join(t for c in nb.cells if c.cell_type == "code" for t in runner._outputs(c))


def test_notebook_executes_quietly_and_its_checks_pass(runner: ModuleType) -> None:
    nb = runner.execute(nbformat.read(runner.NOTEBOOK, as_version=4))
    out = printed(nb, runner)
    assert "attnscope's toy example matches the hand computation" in out
    assert "embeddings from scratch vs the layer-0 attention input" in out
    assert "maths.attention vs scaled_dot_attention" in out and "ok: True" in out and "verified: True" in out
    assert "query head 5 reads k/v head 1, which query heads [3, 4, 5] share" in out  # SmolLM2's grouped-query
    assert "SmolLM2 q        vs the model's forward pass" in out  # the rotation: its q, k and weights are asserted
    assert "SmolLM2 weights  vs the model's forward pass" in out
    assert "head 23.4 removed: p(' Paris') " in out  # the ablation cell
    assert "layer 5: full_attention, sees every token, RoPE base 1,000,000" in out  # Gemma 3's section
    assert "Gemma 3 q        vs the model's forward pass" in out and "Gemma 3 context  vs" in out
    assert "tr.check(): PASS" in out
    assert not NOISE.search(out), NOISE.search(out)
    stderr = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.get("name") == "stderr"]
    assert stderr == []  # nothing on stderr either: no warnings, no progress bars


def test_stored_notebook_has_its_outputs_and_docs_are_rendered_from_them(runner: ModuleType) -> None:
    nb = nbformat.read(runner.NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.get("execution_count") for c in code)  # stored executed, every cell
    assert "output 1 = their sum = [1.9366 6.6831 1.5951]" in printed(nb, runner)
    assert not NOISE.search(printed(nb, runner))
    assert runner.RENDERED.read_text(encoding="utf-8") == runner.render(nb), \
        "docs/ is stale: run `.venv/bin/python examples/notebook.py`"
