"""Import structure: no circles, and the torch-free modules stay torch-free (each in a fresh interpreter)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import attnscope

HEAVY = ("torch", "transformers")


def _imported_after(code: str) -> set[str]:
    """Top-level package names in sys.modules after running code in a fresh interpreter."""
    probe = f"{code}\nimport sys\nprint(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


@pytest.mark.parametrize("module", ["attnscope", "attnscope.stages", "attnscope.records.check_report",
                                    "attnscope.records.trace", "attnscope.records.generation",
                                    "attnscope.records.translation", "attnscope.records.storage",
                                    "attnscope.tokens", "attnscope.views", "attnscope.explain",
                                    "attnscope.explain.steps", "attnscope.explain.toy", "attnscope.records",
                                    "attnscope.tracing", "attnscope.verify", "attnscope.rollout", "attnscope.errors"])
def test_torch_free_modules_import_neither_torch_nor_transformers(module: str) -> None:
    loaded = _imported_after(f"import {module}")
    assert not loaded & set(HEAVY), f"{module} pulled in {sorted(loaded & set(HEAVY))}"


def test_rendering_a_saved_trace_needs_no_torch(tmp_path: Path) -> None:
    """Load a saved trace and render every view: torch and transformers never load, nothing is registered."""
    saved = tmp_path / "t.safetensors"
    attnscope.trace("time flies like an arrow").save(saved)
    loaded = _imported_after(
        "from attnscope.records.storage import load_trace\nfrom attnscope.views import to_html\n"
        f"html = to_html(load_trace({str(saved)!r}))\nassert '<html' in html and 'flies' in html"
    )
    assert not loaded & set(HEAVY)


def _top_level_imports(path: Path, name: str, known: set[str]) -> set[str]:
    """attnscope modules that `name` imports when it is imported (not inside functions or TYPE_CHECKING)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            subs = {f"{base}.{a.name}" for a in node.names}
            found.update(subs & known or {base})  # `from pkg import mod` needs mod; pkg is already importing
    return {m for m in found if m in known and m != name}


def test_no_import_circles() -> None:
    """The graph of module-level imports between attnscope's modules has no cycle."""
    root = Path(attnscope.__file__).parent
    files = {("attnscope." + ".".join(f.relative_to(root).with_suffix("").parts)).removesuffix(".__init__"): f
             for f in root.rglob("*.py")}
    graph = {name: _top_level_imports(f, name, set(files)) for name, f in files.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                pytest.fail("import circle: " + " -> ".join([*path[path.index(nxt):], nxt]))
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
