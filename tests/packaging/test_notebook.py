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
    assert_attribution_section(out)
    assert_faithfulness_section(out)
    assert not NOISE.search(out), NOISE.search(out)
    stderr = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.get("name") == "stderr"]
    assert stderr == []  # nothing on stderr either: no warnings, no progress bars


def assert_attribution_section(out: str) -> None:
    """Section 9: SmolLM2's and MiniLM's attributions, each method's check printed and passing."""
    assert "log p(' Paris' | 'The capital of France is')" in out
    assert out.count("attribution: PASS") == 2  # SmolLM2, then MiniLM: every method's check passed
    checks = re.findall(r"^check (\w+) +(PASS|FAIL|NOT VERIFIED): .* <= (\S+) \(", out, re.M)
    assert len(checks) == 8 + 8 and {status for _, status, _ in checks} == {"PASS"}, checks
    assert {"alti", "norm", "value_zeroing", "leave_one_out", "integrated_gradients"} <= {m for m, _, _ in checks}
    ig = re.search(r"^integrated gradients: (\d+) steps, completeness ([\d.]+)% of f\(x\) - f\(baseline\)", out, re.M)
    assert ig and float(ig[2]) <= 1.0, ig  # completeness within 1% of f(x) - f(baseline)
    paris = re.findall(r"^ *(\d) +(The|capital|of|France|is)( +\S+){8}$", out, re.M)
    assert [int(i) for i, _, _ in paris] == [0, 1, 2, 3, 4], paris  # one row per token, a score per method
    assert re.search(r"^Spearman with leave-one-out: attn [+-]\d\.\d\d, rollout [+-]\d\.\d\d", out, re.M)


def assert_faithfulness_section(out: str) -> None:
    """Section 10: the metrics table for MiniLM and SmolLM2, each value where its definition puts it."""
    for model, examples, cut in (("all-MiniLM-L6-v2", 5, 12), ("smollm2", 3, 8)):
        head = re.search(rf"^{model}: (\d+) UD sentences cut to {cut} tokens, removal delete; unperturbed forward "
                         r"vs the model's own: max error (\S+)$", out, re.M)
        assert head and int(head[1]) == examples and float(head[2]) <= 1e-5, head
    assert out.count("every method's own check PASS on every example: True") == 2
    rows = re.findall(r"^(\w+) +(-?[\d.]+) \[(-?[\d.]+), (-?[\d.]+)\] +(-?[\d.]+) +(-?[\d.]+) +(-?[\d.]+)$", out, re.M)
    names = [r[0] for r in rows]
    assert names.count("leave_one_out") == 2 and names.count("position") == 2 and names.count("random_2") == 2
    assert len(rows) == 9 + 8  # MiniLM: 5 methods + 4 controls; SmolLM2: 4 + 4
    for name, mean, low, high, _, _, rho in rows:
        assert 0.0 <= float(low) <= float(mean) <= float(high) <= 1.0, name  # normalised AOPC within its bounds
        assert -1.0 <= float(rho) <= 1.0
        assert name != "leave_one_out" or float(rho) == 1.0  # leave-one-out against itself


def test_stored_notebook_has_its_outputs_and_docs_are_rendered_from_them(runner: ModuleType) -> None:
    nb = nbformat.read(runner.NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.get("execution_count") for c in code)  # stored executed, every cell
    assert "output 1 = their sum = [1.9366 6.6831 1.5951]" in printed(nb, runner)
    assert not NOISE.search(printed(nb, runner))
    assert runner.RENDERED.read_text(encoding="utf-8") == runner.render(nb), \
        "docs/ is stale: run `.venv/bin/python examples/notebook.py`"
