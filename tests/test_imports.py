"""Import structure: no circles, and the torch-free modules stay torch-free (each in a fresh interpreter)."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import attnscope
from attnscope._moved import MOVED

HEAVY = ("torch", "transformers")


def _imported_after(code: str) -> set[str]:
    """Top-level package names in sys.modules after running code in a fresh interpreter."""
    probe = f"{code}\nimport sys\nprint(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


@pytest.mark.parametrize("module", ["attnscope", "attnscope.stages", "attnscope.records.check_report",
                                    "attnscope.records.trace", "attnscope.records.generation",
                                    "attnscope.records.translation", "attnscope.records.files",
                                    "attnscope.tokens", "attnscope.views", "attnscope.explain",
                                    "attnscope.explain.steps", "attnscope.explain.toy", "attnscope.records",
                                    "attnscope.tracing", "attnscope.verify", "attnscope.rollout", "attnscope.errors",
                                    "attnscope.attribution.record", "attnscope.attribution.render",
                                    "attnscope.views.attribution", "attnscope.faithfulness.metrics",
                                    "attnscope.faithfulness.aggregate", "attnscope.faithfulness.report_page",
                                    "attnscope.corpus.store", "attnscope.views.report_style",
                                    "attnscope.views.raster", "attnscope.records.syntax_counts",
                                    "attnscope.corpus.head_sums", "attnscope.corpus.head_groups",
                                    "attnscope.views.heads"])
def test_torch_free_modules_import_neither_torch_nor_transformers(module: str) -> None:
    loaded = _imported_after(f"import {module}")
    assert not loaded & set(HEAVY), f"{module} pulled in {sorted(loaded & set(HEAVY))}"


def test_rendering_a_saved_trace_needs_no_torch(tmp_path: Path) -> None:
    """Load a saved trace and render every view: torch and transformers never load, nothing is registered."""
    saved = tmp_path / "t.safetensors"
    attnscope.trace("time flies like an arrow").save(saved)
    loaded = _imported_after(
        "from attnscope.records.trace import load_trace\nfrom attnscope.views import to_html\n"
        f"html = to_html(load_trace({str(saved)!r}))\nassert '<html' in html and 'flies' in html"
    )
    assert not loaded & set(HEAVY)


def test_reading_a_heads_pass_needs_no_torch(tmp_path: Path) -> None:
    """Group a saved heads pass (its directory, as `attnscope serve --heads DIR` reads it): torch never loads."""
    import numpy as np

    from attnscope.corpus.head_sums import FILE, HeadSums, save

    points = np.random.default_rng(0).normal(size=(4, 2))  # [unit, 2]: 2 layers x 2 heads
    js = np.linalg.norm(points[:, None] - points[None], axis=-1)  # [unit, unit], 0 on the diagonal
    sums = HeadSums(layers=2, heads=2, tokens=1, documents=1, js=js)
    save(tmp_path / FILE, sums, {"model": "hand-made", "causal": False, "complete": True})
    loaded = _imported_after(f"from attnscope.corpus.head_groups import read_groups\n"
                             f"g = read_groups({str(tmp_path)!r})\nassert g.model == 'hand-made' and g.heads == 2")
    assert not loaded & set(HEAVY), f"reading a heads pass pulled in {sorted(loaded & set(HEAVY))}"


def _runs(tree: ast.AST) -> list[ast.AST]:
    """Every node of the tree but those under `if TYPE_CHECKING:` (imports for annotations never run)."""
    nodes: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        nodes.append(node)
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return nodes


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """attnscope modules that `name` imports when it runs: at module level or inside functions."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in _runs(ast.parse(path.read_text(encoding="utf-8"))):
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


def _graph() -> dict[str, set[str]]:
    root = Path(attnscope.__file__).parent
    files = {("attnscope." + ".".join(f.relative_to(root).with_suffix("").parts)).removesuffix(".__init__"): f
             for f in root.rglob("*.py")}
    return {name: _imports(f, name, set(files)) for name, f in files.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return groups


def test_circle_finder_finds_a_circle_hidden_in_a_function(tmp_path: Path) -> None:
    hidden = tmp_path / "b.py"
    hidden.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x.c\n"
                      "def f():\n    import x.a\n", encoding="utf-8")
    assert _imports(hidden, "x.b", {"x.a", "x.b", "x.c"}) == {"x.a"}
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles() -> None:
    """The graph of every import between attnscope's modules that can run, those inside functions included,
    has no cycle. Imports under TYPE_CHECKING only name types for annotations (a view names the record it
    draws) and never run, so they are not edges."""
    assert _circles(_graph()) == []


ROOT = Path(__file__).resolve().parents[1]
_FROM = re.compile(r"from (attnscope(?:\.\w+)*) import \(?([\w, ]+)")
_DOTTED = re.compile(r"(?<![\w/.-])attnscope(?:\.\w+)+(?![\w/])")  # not a format name such as attnscope.qkmap/1
_JAVASCRIPT = {"attnscope.figureReady"}  # the pages' own JavaScript (window.attnscope), not Python


def _documented_paths() -> set[str]:
    """Every attnscope name the README and the docs show: `from attnscope.x import a, b` and attnscope.x.y."""
    found: set[str] = set()
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for module, names in _FROM.findall(text):
            found.update(f"{module}.{n.split(' as ')[0].strip()}" for n in names.split(",") if n.strip())
        found.update(_DOTTED.findall(text))
    return found - _JAVASCRIPT


def _resolve(path: str) -> object:
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(path)


def test_every_path_the_docs_show_imports() -> None:
    paths = _documented_paths()
    assert len(paths) > 30  # the README and docs name many; an empty set would mean the scan broke
    broken = []
    for path in sorted(paths):
        try:
            _resolve(path)
        except (ImportError, AttributeError) as exc:
            broken.append(f"{path}: {exc}")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_module_paths_load_the_moved_modules(old: str) -> None:
    """Code written against the flat layout keeps working: the old name is the new module itself."""
    assert importlib.import_module(old) is importlib.import_module(MOVED[old])
